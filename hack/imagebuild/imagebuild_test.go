package imagebuild

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/ociimage"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func readDockerfile(t *testing.T) *dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(string(data))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return d
}

// TestDockerfileBuildStage: imagebuild builds the binaries with the build
// stage's command and environment, and restates the runtime stage's base.
func TestDockerfileBuildStage(t *testing.T) {
	d := readDockerfile(t)
	env := map[string]string{}
	for _, kv := range buildEnv() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, diff := range diffMaps(d.buildEnv, env, "Dockerfile build stage ENV", "imagebuild's buildEnv") {
		t.Error(diff)
	}
	if !strings.Contains(strings.Join(d.buildRuns, "\n"), "make build BIN=/out") {
		t.Errorf("the build stage does not run `make build BIN=/out` (its RUNs: %q); imagebuild runs `make build BIN=<dir>`", d.buildRuns)
	}
	// cachetierSpec restates what this base provides (the nonroot user,
	// /tmp, /home/nonroot); another base needs another restatement.
	if !strings.HasPrefix(d.runtimeRef, "gcr.io/distroless/static") || !strings.HasSuffix(d.runtimeRef, ":nonroot") {
		t.Errorf("runtime base %q: cachetierSpec restates distroless static :nonroot", d.runtimeRef)
	}
}

// TestImages builds the cachetier and pause images twice, into fresh
// directories, as `make image` does. The binaries come from the warm Go
// build cache (the linker still runs: see Build), so this costs two builds
// of the three cachetier commands, not a cold compile.
func TestImages(t *testing.T) {
	root := repoRoot(t)
	names := []string{Cachetier, Pause}
	outA, outB := t.TempDir(), t.TempDir()
	a, err := Build(t.Context(), Options{Root: root, Out: outA, Images: names})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(t.Context(), Options{Root: root, Out: outB, Images: names})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("reproducible", func(t *testing.T) {
		for i := range names {
			if a[i].Digest != b[i].Digest || a[i].Ref != b[i].Ref {
				t.Errorf("%s: two builds of the same sources gave %s (%s) and %s (%s)", names[i], a[i].Digest, a[i].Ref, b[i].Digest, b[i].Ref)
			}
			if fileSum(t, a[i].Tar) != fileSum(t, b[i].Tar) {
				t.Errorf("%s: the archives differ", names[i])
			}
		}
	})

	t.Run("idempotent", func(t *testing.T) {
		again, err := Build(t.Context(), Options{Root: root, Out: outA, Images: names})
		if err != nil {
			t.Fatal(err)
		}
		for i := range again {
			if again[i].Written {
				t.Errorf("%s: an unchanged archive was written again", names[i])
			}
			again[i].Written = a[i].Written
		}
		if !reflect.DeepEqual(again, a) {
			t.Errorf("second Build: %+v, first %+v", again, a)
		}
		listed, err := ReadManifest(outA)
		if err != nil {
			t.Fatal(err)
		}
		for i := range listed {
			listed[i].Written = a[i].Written
		}
		if !reflect.DeepEqual(listed, a) {
			t.Errorf("%s lists %+v, Build returned %+v", ManifestFile, listed, a)
		}
	})

	cachetier := readImage(t, a[0])
	t.Run("dockerfile agreement", func(t *testing.T) {
		d := readDockerfile(t)
		for _, diff := range diffMaps(d.labels, cachetier.config.Config.Labels, "Dockerfile LABEL", "image label") {
			t.Error(diff)
		}
		if got := cachetier.config.Config.User; got != d.user {
			t.Errorf("image user %q, Dockerfile USER %q", got, d.user)
		}
		if got := cachetier.config.Config.Entrypoint; !reflect.DeepEqual(got, d.entrypoint) {
			t.Errorf("image entrypoint %q, Dockerfile ENTRYPOINT %q", got, d.entrypoint)
		}
		// Every COPY'd binary is in the image, byte for byte what the
		// build stage's command produced...
		for dst, src := range d.copies {
			built := filepath.Join(outA, "build", Cachetier, strings.TrimPrefix(src, "/out/"))
			f, ok := cachetier.files[dst]
			switch {
			case !strings.HasPrefix(src, "/out/"):
				t.Errorf("COPY --from=build %s %s: not an output of `make build BIN=/out`", src, dst)
			case !ok:
				t.Errorf("Dockerfile copies %s to %s; the image has no %s", src, dst, dst)
			case f.mode != 0o755:
				t.Errorf("%s: mode %o, want 0755", dst, f.mode)
			case f.sum != fileSum(t, built):
				t.Errorf("%s differs from the build's %s", dst, built)
			}
		}
		// ...and every executable in the image is one the Dockerfile copies.
		for name, f := range cachetier.files {
			if _, copied := d.copies[name]; f.mode&0o111 != 0 && !f.dir && !copied {
				t.Errorf("the image has executable %s; the Dockerfile does not copy it", name)
			}
		}
	})

	t.Run("fleet needs", func(t *testing.T) {
		// controllers' pod specs run /cache-server as 65532 with a
		// read-only root: everything they need is in the image and
		// owned by root, the writable /tmp aside.
		want := map[string]imageFile{
			"/manager":      {mode: 0o755},
			"/cache-server": {mode: 0o755},
			"/etc/passwd":   {mode: 0o644},
			"/etc/group":    {mode: 0o644},
			"/tmp":          {mode: 0o1777, dir: true},
			"/home/nonroot": {mode: 0o700, dir: true, uid: nonrootUID, gid: nonrootUID},
			"/etc":          {mode: 0o755, dir: true},
			"/home":         {mode: 0o755, dir: true},
		}
		for name, w := range want {
			f, ok := cachetier.files[name]
			f.sum = ""
			if !ok || f != w {
				t.Errorf("%s: %+v (present %v), want %+v", name, f, ok, w)
			}
		}
		if len(cachetier.files) != len(want) {
			t.Errorf("image files %v, want exactly %v", slices.Sorted(maps.Keys(cachetier.files)), slices.Sorted(maps.Keys(want)))
		}
		if !strings.Contains(string(cachetier.content["/etc/passwd"]), "nonroot:x:65532:65532:") {
			t.Errorf("/etc/passwd has no nonroot 65532: %q", cachetier.content["/etc/passwd"])
		}
		if want := "ghcr.io/cachetier/cachetier:dev-" + strings.TrimPrefix(a[0].Digest, "sha256:")[:12]; a[0].Ref != want {
			t.Errorf("ref %s, want %s", a[0].Ref, want)
		}
	})

	t.Run("binaries", func(t *testing.T) {
		dir := filepath.Join(outA, "build", Cachetier)
		for _, name := range []string{"manager", "cache-server"} {
			p := filepath.Join(dir, name)
			if err := checkStatic(p); err != nil {
				t.Error(err)
			}
			info, err := buildinfo.ReadFile(p)
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
		}
		// Both start (the image's entrypoint and the fleet's command).
		usage := exec.Command(filepath.Join(dir, "cache-server"))
		if b, err := usage.CombinedOutput(); err == nil || !strings.Contains(string(b), "cache-server shard") || !strings.Contains(string(b), "cache-server front") {
			t.Errorf("cache-server without a role: err %v, output %q; want the usage naming every role", err, b)
		}
		help := exec.Command(filepath.Join(dir, "manager"), "--help")
		if b, _ := help.CombinedOutput(); !strings.Contains(string(b), "-leader-elect") {
			t.Errorf("manager --help printed %q", b)
		}
	})

	t.Run("pause", func(t *testing.T) {
		pause := readImage(t, a[1])
		c := pause.config.Config
		if c.User != "65535:65535" || !reflect.DeepEqual(c.Entrypoint, []string{"/pause"}) {
			t.Errorf("pause config user %q entrypoint %q", c.User, c.Entrypoint)
		}
		if f := pause.files["/pause"]; f.mode != 0o755 || len(pause.files) != 1 {
			t.Errorf("pause files %+v", pause.files)
		}
		if !strings.HasPrefix(a[1].Ref, "localhost/cachetier/pause:dev-") {
			t.Errorf("pause ref %s", a[1].Ref)
		}
	})
}

func TestCheckStatic(t *testing.T) {
	// Debian's coreutils are dynamically linked.
	if err := checkStatic("/bin/true"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("checkStatic(/bin/true) = %v", err)
	}
	if err := checkStatic("/etc/passwd"); err == nil {
		t.Error("checkStatic accepted a text file")
	}
}

func TestUnknownImage(t *testing.T) {
	_, err := Build(t.Context(), Options{Root: repoRoot(t), Out: t.TempDir(), Images: []string{"nginx"}})
	if err == nil || !strings.Contains(err.Error(), "unknown image") {
		t.Errorf("Build(nginx) = %v", err)
	}
}

// imageFile is a layer entry as the tests compare it.
type imageFile struct {
	mode     int64
	dir      bool
	uid, gid int
	sum      string
}

type readBack struct {
	config  *v1.ConfigFile
	files   map[string]imageFile
	content map[string][]byte // of small files
}

// readImage reads an archive back, checks it is a valid image under the
// ref and digest Build reported, and lists its layer.
func readImage(t *testing.T, im Image) readBack {
	t.Helper()
	f, err := os.Open(im.Tar)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, index, err := ociimage.ReadArchive(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("%s: %v", im.Tar, err)
	}
	d, _ := img.Digest()
	if d.String() != im.Digest || index.Manifests[0].Annotations[ociimage.AnnotationImageName] != im.Ref {
		t.Fatalf("%s holds %s named %v; Build reported %s %s", im.Tar, d, index.Manifests[0].Annotations, im.Digest, im.Ref)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	out := readBack{config: cf, files: map[string]imageFile{}, content: map[string][]byte{}}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean("/" + h.Name)
		sum := sha256.New()
		var small bytes.Buffer
		w := io.Writer(sum)
		if h.Size < 1<<16 {
			w = io.MultiWriter(sum, &small)
		}
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		out.content[name] = small.Bytes()
		out.files[name] = imageFile{mode: h.Mode, dir: h.Typeflag == tar.TypeDir, uid: h.Uid, gid: h.Gid}
		if h.Typeflag == tar.TypeReg {
			out.files[name] = imageFile{mode: h.Mode, uid: h.Uid, gid: h.Gid, sum: string(sum.Sum(nil))}
		}
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return string(h.Sum(nil))
}
