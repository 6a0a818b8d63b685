// Package imagebuild checks the Dockerfile's build stage the only way this
// machine allows: no container engine runs here and base images cannot be
// pulled, so the image itself is not built. What the build stage does —
// `make build BIN=/out` with the Dockerfile's environment — is run natively
// and its output checked: both binaries, static, reproducible, runnable.
package imagebuild

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// buildEnv reads the build stage's ENV line (GOOS, GOARCH, CGO_ENABLED,
// GOFLAGS) and the make command from the Dockerfile.
func buildEnv(t *testing.T, root string) (env []string, makeArgs []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines.
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	envLine := regexp.MustCompile(`(?m)^ENV (.*)$`).FindStringSubmatch(text)
	if envLine == nil {
		t.Fatal("Dockerfile: no ENV line in the build stage")
	}
	for _, m := range regexp.MustCompile(`(\w+)=("[^"]*"|\S+)`).FindAllStringSubmatch(envLine[1], -1) {
		v := strings.Trim(m[2], `"`)
		switch v {
		case "${TARGETOS}":
			v = "linux"
		case "${TARGETARCH}":
			v = "amd64"
		}
		env = append(env, m[1]+"="+v)
	}
	mk := regexp.MustCompile(`make build BIN=/out`).FindString(text)
	if mk == "" {
		t.Fatal("Dockerfile: the build stage does not run `make build BIN=/out`")
	}
	return env, []string{"build"}
}

func TestDockerfileBuildStage(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, args := buildEnv(t, root)
	var outs []string
	for i := range 2 {
		out := filepath.Join(t.TempDir(), "out")
		cmd := exec.Command("make", append(args, "BIN="+out)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %d: make %s: %v\n%s", i, strings.Join(args, " "), err, b)
		}
		outs = append(outs, out)
	}
	for _, name := range []string{"manager", "cache-server"} {
		path := filepath.Join(outs[0], name)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked (has an interpreter); the distroless static image cannot run it", name)
			}
		}
		libs, _ := f.ImportedLibraries()
		if len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v", name, libs)
		}
		f.Close()
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		if settings["-trimpath"] != "true" || settings["CGO_ENABLED"] != "0" {
			t.Errorf("%s: build settings %v: want -trimpath and CGO_ENABLED=0", name, settings)
		}
		if _, stamped := settings["vcs.revision"]; stamped {
			t.Errorf("%s carries VCS stamping; the image build must not depend on .git", name)
		}
		a, _ := os.ReadFile(path)
		b, _ := os.ReadFile(filepath.Join(outs[1], name))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two builds of the same sources", name)
		}
	}
	// Both start (the image's entrypoint and the fleet's command).
	usage := exec.Command(filepath.Join(outs[0], "cache-server"))
	if b, err := usage.CombinedOutput(); err == nil || !strings.Contains(string(b), "cache-server shard") || !strings.Contains(string(b), "cache-server front") {
		t.Errorf("cache-server without a role: err %v, output %q; want the usage naming every role", err, b)
	}
	help := exec.Command(filepath.Join(outs[0], "manager"), "--help")
	if b, _ := help.CombinedOutput(); !strings.Contains(string(b), "-") {
		t.Errorf("manager --help printed %q", b)
	}
}
