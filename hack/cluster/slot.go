package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// slotDir holds one lock file per slot. A slot is owned by whoever holds the
// flock on its file: the kernel drops the lock when the owner dies however
// it dies (a test binary killed by its timeout runs no cleanup), so a slot
// whose lock can be taken but whose record names a directory was abandoned,
// and its leftovers are removed before it is used again.
const slotDir = "/run/cachetier-clusters"

// slot is a held slot: the open, locked file and what the previous owner
// recorded, if it did not clean up.
type slot struct {
	index int
	file  *os.File
}

// slotRecord is written into the lock file while a cluster runs.
type slotRecord struct {
	Dir string `json:"dir"`
	PID int    `json:"pid"`
}

// acquireSlot locks the first free slot. abandoned is the record a dead
// owner left (zero when the slot was clean).
func acquireSlot() (s *slot, abandoned slotRecord, err error) {
	if err := os.MkdirAll(slotDir, 0o755); err != nil {
		return nil, abandoned, err
	}
	for i := 0; i < MaxSlots; i++ {
		f, err := os.OpenFile(filepath.Join(slotDir, fmt.Sprintf("slot-%d", i)), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, abandoned, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue
			}
			return nil, abandoned, fmt.Errorf("lock slot %d: %w", i, err)
		}
		var rec slotRecord
		if data, _ := os.ReadFile(f.Name()); len(data) > 0 {
			_ = json.Unmarshal(data, &rec)
		}
		return &slot{index: i, file: f}, rec, nil
	}
	return nil, abandoned, fmt.Errorf("all %d cluster slots are in use (%s)", MaxSlots, slotDir)
}

// record notes the running cluster's directory in the slot, for the next
// owner in case this one dies without cleaning up.
func (s *slot) record(rec slotRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.file.Truncate(0); err != nil {
		return err
	}
	_, err = s.file.WriteAt(data, 0)
	return err
}

// release clears the record and unlocks the slot.
func (s *slot) release() error {
	err := s.file.Truncate(0)
	return errors.Join(err, s.file.Close())
}

// slotHeld says whether a running cluster owns slot (its number, as in the
// namespace's name).
func slotHeld(slot string) bool {
	f, err := os.OpenFile(filepath.Join(slotDir, "slot-"+slot), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
