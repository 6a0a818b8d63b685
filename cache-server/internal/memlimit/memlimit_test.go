package memlimit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name, file, content string
		want                int64
		ok, wantErr         bool
	}{
		{"v2 limit", "memory.max", "536870912\n", 536870912, true, false},
		{"v2 unlimited", "memory.max", "max\n", 0, false, false},
		{"v1 limit", "memory/memory.limit_in_bytes", "1073741824\n", 1073741824, true, false},
		{"v1 unlimited", "memory/memory.limit_in_bytes", "9223372036854771712\n", 0, false, false},
		{"garbage", "memory.max", "lots\n", 0, false, true},
		{"no cgroup files", "", "", 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.file != "" {
				p := filepath.Join(root, tc.file)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, ok, err := Read(root)
			if (err != nil) != tc.wantErr || ok != tc.ok || got != tc.want {
				t.Fatalf("Read = %d, %v, %v; want %d, %v, error %v", got, ok, err, tc.want, tc.ok, tc.wantErr)
			}
		})
	}
}

// TestReadThisMachine reads the real cgroup of the test process: whatever
// it holds must parse.
func TestReadThisMachine(t *testing.T) {
	v, ok, err := Read("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("limit %d (set: %v)", v, ok)
}
