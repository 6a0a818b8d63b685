// Package memlimit reads the memory limit of the process' cgroup: the
// container's memory limit in a pod. The alert "memory near the limit"
// compares it with the process' resident memory; Go does not know the
// limit on its own (GOMEMLIMIT is not set from it).
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// unlimited: cgroup v1 reports "no limit" as a huge page-aligned number
// (9223372036854771712), v2 as "max".
const unlimited = 1 << 60

// Read returns the limit in bytes found under root (normally
// /sys/fs/cgroup), and false when there is none or no cgroup file exists.
func Read(root string) (int64, bool, error) {
	// The limit files of cgroup v2 (the unified hierarchy) and v1 (the
	// memory controller), relative to the cgroup mount root; inside a
	// container its own cgroup is mounted there.
	for _, f := range []string{"memory.max", "memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		return parse(string(b))
	}
	return 0, false, nil
}

func parse(s string) (int64, bool, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("memory limit %q: %w", s, err)
	}
	if v <= 0 || v >= unlimited {
		return 0, false, nil
	}
	return v, true, nil
}
