package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func testSpec(t *testing.T) Spec {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("#!binary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Files: []File{
			{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
			{Path: "/app", Mode: 0o755, Source: src},
			{Path: "/etc/passwd", Mode: 0o644, Content: []byte("nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n")},
			{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
		},
		Config: Config{
			User:       "65532:65532",
			Entrypoint: []string{"/app"},
			Cmd:        []string{"--flag"},
			Env:        []string{"A=b"},
			WorkingDir: "/home/nonroot",
			Labels:     map[string]string{"org.opencontainers.image.source": "https://example.invalid/x", "b": "c"},
		},
	}
}

func archive(t *testing.T, spec Spec, ref string) (v1.Hash, []byte) {
	t.Helper()
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, img, ref); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d, buf.Bytes()
}

func TestReproducible(t *testing.T) {
	spec := testSpec(t)
	d1, a1 := archive(t, spec, "localhost/x/app:1")
	// The same spec, its files listed in another order.
	spec.Files = slices.Clone(spec.Files)
	slices.Reverse(spec.Files)
	d2, a2 := archive(t, spec, "localhost/x/app:1")
	if d1 != d2 || !bytes.Equal(a1, a2) {
		t.Fatalf("two builds of one spec: digests %s and %s, archives equal %v", d1, d2, bytes.Equal(a1, a2))
	}
	// Any change of content, mode, owner or config changes the digest.
	changes := map[string]func(*Spec){
		"content": func(s *Spec) { s.Files[1].Content = []byte("other") },
		"mode":    func(s *Spec) { s.Files[0].Mode = fs.ModeDir | 0o777 },
		"owner":   func(s *Spec) { s.Files[2].UID = 1 },
		"label":   func(s *Spec) { s.Config.Labels = map[string]string{"b": "c"} },
		"user":    func(s *Spec) { s.Config.User = "0" },
	}
	for name, change := range changes {
		s := testSpec(t)
		s.Files[1].Source, s.Files[1].Content = "", []byte("#!binary\n")
		change(&s)
		if d, _ := archive(t, s, "localhost/x/app:1"); d == d1 {
			t.Errorf("changing the %s kept digest %s", name, d)
		}
	}
}

// TestArchiveReadsBack unpacks the archive and reads it with
// go-containerregistry's OCI layout reader, as a registry-less consumer
// would, and checks every field the spec set.
func TestArchiveReadsBack(t *testing.T) {
	spec := testSpec(t)
	ref := "ghcr.io/example/app:dev-1"
	digest, data := archive(t, spec, ref)

	dir := t.TempDir()
	untar(t, data, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Digest != digest || desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("index points at %s (%s), want %s (OCI manifest)", desc.Digest, desc.MediaType, digest)
	}
	if desc.Annotations[AnnotationImageName] != ref || desc.Annotations[AnnotationRefName] != "dev-1" {
		t.Errorf("annotations %v", desc.Annotations)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
		t.Errorf("platform %v", desc.Platform)
	}
	if got, err := ReadArchiveIndex(bytes.NewReader(data)); err != nil || !reflect.DeepEqual(got, im) {
		t.Errorf("ReadArchiveIndex = %v, %v; want %v", got, err, im)
	}

	fromLayout, err := idx.Image(digest)
	if err != nil {
		t.Fatal(err)
	}
	fromArchive, archiveIndex, err := ReadArchive(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(archiveIndex, im) {
		t.Errorf("ReadArchive's index %v, want %v", archiveIndex, im)
	}
	for reader, img := range map[string]v1.Image{"layout": fromLayout, "ReadArchive": fromArchive} {
		t.Run(reader, func(t *testing.T) { checkImage(t, img, spec, digest) })
	}
}

func checkImage(t *testing.T, img v1.Image, spec Spec, digest v1.Hash) {
	if d, err := img.Digest(); err != nil || d != digest {
		t.Errorf("digest %s, %v; want %s", d, err, digest)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("validate: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	want := v1.Config{
		User: spec.Config.User, Entrypoint: spec.Config.Entrypoint, Cmd: spec.Config.Cmd,
		Env: spec.Config.Env, WorkingDir: spec.Config.WorkingDir, Labels: spec.Config.Labels,
	}
	if !reflect.DeepEqual(cf.Config, want) {
		t.Errorf("config %+v, want %+v", cf.Config, want)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Created.Unix() != 0 {
		t.Errorf("config os %s arch %s created %v", cf.OS, cf.Architecture, cf.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v, %v", layers, err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s", mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	type row struct {
		name        string
		typ         byte
		mode        int64
		uid, gid    int
		content     string
		modUnixTime int64
	}
	var got []row
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got = append(got, row{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, string(b), h.ModTime.Unix()})
	}
	wantRows := []row{
		{"app", tar.TypeReg, 0o755, 0, 0, "#!binary\n", 0},
		{"etc/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"etc/passwd", tar.TypeReg, 0o644, 0, 0, "nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n", 0},
		{"home/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"home/nonroot/", tar.TypeDir, 0o700, 65532, 65532, "", 0},
		{"tmp/", tar.TypeDir, 0o1777, 0, 0, "", 0},
	}
	if !reflect.DeepEqual(got, wantRows) {
		t.Errorf("layer entries:\n got %+v\nwant %+v", got, wantRows)
	}
}

func TestBadInput(t *testing.T) {
	cases := map[string]File{
		"relative path":  {Path: "app", Mode: 0o755},
		"unclean path":   {Path: "/a/../app", Mode: 0o755},
		"root":           {Path: "/", Mode: fs.ModeDir | 0o755},
		"symlink":        {Path: "/app", Mode: fs.ModeSymlink | 0o777},
		"dir content":    {Path: "/d", Mode: fs.ModeDir | 0o755, Content: []byte("x")},
		"both sources":   {Path: "/app", Mode: 0o755, Content: []byte("x"), Source: "/etc/hostname"},
		"negative owner": {Path: "/app", Mode: 0o755, UID: -1},
		"missing source": {Path: "/app", Mode: 0o755, Source: "/nonexistent/app"},
	}
	for name, f := range cases {
		if _, err := Build(Spec{Files: []File{f}}); err == nil {
			t.Errorf("%s: Build accepted %+v", name, f)
		}
	}
	if _, err := Build(Spec{Files: []File{{Path: "/a", Mode: 0o644}, {Path: "/a", Mode: 0o644}}}); err == nil {
		t.Error("a path listed twice was accepted")
	}
	if _, err := Build(Spec{Files: []File{{Path: "/a", Mode: 0o644}, {Path: "/a/b", Mode: 0o644}}}); err == nil {
		t.Error("a file under a file was accepted")
	}
	img, err := Build(Spec{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"app:1", "ghcr.io/x/app", "ghcr.io/x/app@sha256:" + strings.Repeat("0", 64), "Bad/Ref:1"} {
		if err := WriteArchive(io.Discard, img, ref); err == nil {
			t.Errorf("WriteArchive accepted ref %q", ref)
		}
	}
	if _, err := ReadArchiveIndex(strings.NewReader("not a tar")); err == nil {
		t.Error("ReadArchiveIndex accepted garbage")
	}
	if _, _, err := ReadArchive(strings.NewReader("not a tar")); err == nil {
		t.Error("ReadArchive accepted garbage")
	}
	var empty bytes.Buffer
	tar.NewWriter(&empty).Close()
	if _, _, err := ReadArchive(&empty); err == nil {
		t.Error("ReadArchive accepted an archive without index.json")
	}
}

// FuzzReadArchive: whatever the bytes, ReadArchive and ReadArchiveIndex
// return an error or an image, and never panic.
func FuzzReadArchive(f *testing.F) {
	img, err := Build(Spec{Files: []File{{Path: "/a", Mode: 0o644, Content: []byte("a")}}})
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, img, "localhost/x/a:1"); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		ReadArchiveIndex(bytes.NewReader(data))
		if img, _, err := ReadArchive(bytes.NewReader(data)); err == nil {
			validate.Image(img)
		}
	})
}

// untar extracts an archive written by WriteArchive (regular files and
// directories only).
func untar(t *testing.T, data []byte, dir string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, 0o644)
			}
		default:
			t.Fatalf("unexpected entry %s type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
