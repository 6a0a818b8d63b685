// Package ociimage builds reproducible OCI images from a list of files and
// writes them as OCI archives that containerd imports without a registry
// (`ctr -n k8s.io images import`).
//
// Reproducible means the same Spec gives the same bytes: one layer whose tar
// entries are sorted by path and whose owners, modes and times come from the
// spec alone (every timestamp is the Unix epoch), gzip at a fixed level, and
// a config whose created times are the epoch too. The manifest digest then
// names the content, and a tag derived from it changes exactly when the
// content does.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epochSeconds is every timestamp in an image (tar entries, the config's
// created time, its history): a constant, as SOURCE_DATE_EPOCH would be, so
// the time of the build never reaches the bytes.
const epochSeconds = 0

// layerGzipLevel is part of the format: another level gives other bytes and
// another digest for the same files. BestSpeed is go-containerregistry's own
// default and keeps a rebuild of ~200 MB of binaries at a few seconds.
const layerGzipLevel = gzip.BestSpeed

// File is one entry of the image's single layer: a regular file or a
// directory.
type File struct {
	// Path is the absolute, clean path inside the image, e.g. "/manager".
	Path string
	// Mode holds the permission bits, optionally fs.ModeSetuid, ModeSetgid
	// and ModeSticky, and fs.ModeDir for a directory (e.g.
	// fs.ModeDir|fs.ModeSticky|0o777 for /tmp). No other type bits.
	Mode     fs.FileMode
	UID, GID int
	// Content is a regular file's bytes. Source, instead, names a host file
	// read when the image is built (only its bytes are used: never its
	// mode, owner or time).
	Content []byte
	Source  string
}

// Config is what the image declares to the runtime (OCI image config).
type Config struct {
	User       string
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Labels     map[string]string
}

// Spec describes a whole image. Parent directories that Files do not list
// are added as root-owned 0755 directories.
type Spec struct {
	Files  []File
	Config Config
	// OS and Architecture default to linux/amd64.
	OS, Architecture string
}

// Build returns the image the spec describes. Nothing in it depends on the
// time or the machine of the build, only on the spec (and on Source files'
// bytes).
func Build(spec Spec) (v1.Image, error) {
	layerTar, err := layerTar(spec.Files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(layerGzipLevel),
		// Compress once: the digest and the archive both read it.
		tarball.WithCompressedCaching,
	)
	if err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	osName, arch := spec.OS, spec.Architecture
	if osName == "" {
		osName = "linux"
	}
	if arch == "" {
		arch = "amd64"
	}
	created := v1.Time{Time: time.Unix(epochSeconds, 0).UTC()}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           osName,
		Created:      created,
		Config: v1.Config{
			User:       spec.Config.User,
			Entrypoint: spec.Config.Entrypoint,
			Cmd:        spec.Config.Cmd,
			Env:        spec.Config.Env,
			WorkingDir: spec.Config.WorkingDir,
			Labels:     spec.Config.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("ociimage: config: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: "cachetier hack/ociimage"},
	})
	if err != nil {
		return nil, fmt.Errorf("ociimage: append layer: %w", err)
	}
	return img, nil
}

// entry is one tar entry of the layer.
type entry struct {
	name string // relative to the root, no trailing slash
	file File
	data []byte
}

// layerTar renders the files, plus their undeclared parent directories, as
// an uncompressed tar sorted by path.
func layerTar(files []File) ([]byte, error) {
	entries := map[string]*entry{}
	for _, f := range files {
		if err := checkFile(f); err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(f.Path, "/")
		if _, dup := entries[name]; dup {
			return nil, fmt.Errorf("ociimage: %s is listed twice", f.Path)
		}
		e := &entry{name: name, file: f, data: f.Content}
		if f.Source != "" {
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("ociimage: %s: %w", f.Path, err)
			}
			e.data = b
		}
		entries[name] = e
	}
	for name := range entries {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if parent, ok := entries[dir]; ok {
				if !parent.file.Mode.IsDir() {
					return nil, fmt.Errorf("ociimage: /%s is a file but /%s is under it", dir, name)
				}
				continue
			}
			entries[dir] = &entry{name: dir, file: File{Path: "/" + dir, Mode: fs.ModeDir | 0o755}}
		}
	}
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	// A parent's name is a prefix of its children's, so it sorts first.
	slices.Sort(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range names {
		e := entries[name]
		hdr := &tar.Header{
			Name:    e.name,
			Mode:    tarMode(e.file.Mode),
			Uid:     e.file.UID,
			Gid:     e.file.GID,
			ModTime: time.Unix(epochSeconds, 0),
		}
		if e.file.Mode.IsDir() {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("ociimage: %s: %w", e.file.Path, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("ociimage: %s: %w", e.file.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkFile refuses what the layer cannot express or would express
// ambiguously.
func checkFile(f File) error {
	if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
		return fmt.Errorf("ociimage: path %q: want an absolute, clean path below /", f.Path)
	}
	if extra := f.Mode &^ (fs.ModeDir | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky); extra != 0 {
		return fmt.Errorf("ociimage: %s: mode %v: only regular files and directories are supported", f.Path, f.Mode)
	}
	if f.UID < 0 || f.GID < 0 {
		return fmt.Errorf("ociimage: %s: negative owner %d:%d", f.Path, f.UID, f.GID)
	}
	switch {
	case f.Mode.IsDir() && (f.Content != nil || f.Source != ""):
		return fmt.Errorf("ociimage: %s: a directory has no content", f.Path)
	case f.Content != nil && f.Source != "":
		return fmt.Errorf("ociimage: %s: both Content and Source set", f.Path)
	}
	return nil
}

// tarMode converts Go's mode bits to the Unix ones tar stores.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}
