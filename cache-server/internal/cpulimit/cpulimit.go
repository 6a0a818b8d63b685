// Package cpulimit reads the CPU limit of the process' cgroup: the
// container's CPU limit in a pod (its CFS quota over its period). The
// tier sizes its priority-and-fairness concurrency from it, as a
// container's memory limit is read by package memlimit.
package cpulimit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Read returns the limit in cores found under root (normally
// /sys/fs/cgroup), and false when there is none or no cgroup file exists.
func Read(root string) (float64, bool, error) {
	// cgroup v2: "cpu.max" holds "<quota> <period>", quota "max" when
	// unlimited.
	b, err := os.ReadFile(filepath.Join(root, "cpu.max"))
	switch {
	case err == nil:
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, false, fmt.Errorf("cpu.max %q: want \"<quota> <period>\"", strings.TrimSpace(string(b)))
		}
		return quota(f[0], f[1])
	case !errors.Is(err, fs.ErrNotExist):
		return 0, false, err
	}
	// cgroup v1: the cpu controller's cfs_quota_us (-1 when unlimited)
	// and cfs_period_us.
	q, err := os.ReadFile(filepath.Join(root, "cpu", "cpu.cfs_quota_us"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	p, err := os.ReadFile(filepath.Join(root, "cpu", "cpu.cfs_period_us"))
	if err != nil {
		return 0, false, err
	}
	return quota(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

func quota(q, p string) (float64, bool, error) {
	if q == "max" || q == "-1" {
		return 0, false, nil
	}
	quota, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("CPU quota %q: %w", q, err)
	}
	period, err := strconv.ParseInt(p, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("CPU period %q: %w", p, err)
	}
	if quota <= 0 || period <= 0 {
		return 0, false, fmt.Errorf("CPU quota %d over period %d: both must be positive", quota, period)
	}
	return float64(quota) / float64(period), true, nil
}
