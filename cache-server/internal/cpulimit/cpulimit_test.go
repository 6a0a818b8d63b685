package cpulimit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		want    float64
		ok      bool
		wantErr bool
	}{
		{"v2 limit", map[string]string{"cpu.max": "150000 100000\n"}, 1.5, true, false},
		{"v2 unlimited", map[string]string{"cpu.max": "max 100000\n"}, 0, false, false},
		{"v2 garbage", map[string]string{"cpu.max": "lots\n"}, 0, false, true},
		{"v2 bad quota", map[string]string{"cpu.max": "x 100000\n"}, 0, false, true},
		{"v2 zero period", map[string]string{"cpu.max": "100 0\n"}, 0, false, true},
		{"v1 limit", map[string]string{"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2, true, false},
		{"v1 unlimited", map[string]string{"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0, false, false},
		{"v1 no period", map[string]string{"cpu/cpu.cfs_quota_us": "50000\n"}, 0, false, true},
		{"no cgroup files", nil, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, ok, err := Read(root)
			if (err != nil) != tc.wantErr || ok != tc.ok || got != tc.want {
				t.Fatalf("Read = %v, %v, %v; want %v, %v, error %v", got, ok, err, tc.want, tc.ok, tc.wantErr)
			}
		})
	}
}

// TestReadsThisMachine: the real cgroup files of the test's own process
// parse (whatever the limit), so the format assumptions meet a kernel.
func TestReadsThisMachine(t *testing.T) {
	if _, _, err := Read("/sys/fs/cgroup"); err != nil {
		t.Fatal(err)
	}
}
