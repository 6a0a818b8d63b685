package ociimage

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on the manifest descriptor in index.json. containerd's import
// names the image after AnnotationImageName; OCI tools read AnnotationRefName
// (the tag, as containerd's own export writes it).
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// WriteArchive writes img as an OCI image layout packed in a tar
// (oci-layout, index.json, blobs/sha256/...), the form `ctr images import`
// reads. ref must be fully qualified ("registry/repo:tag"): the CRI
// normalises a short name like "pause:1" to docker.io/library/pause:1, which
// would then not match the imported image.
//
// The archive is as reproducible as the image: fixed entry order, modes and
// times. index.json comes first so that ReadArchiveIndex stops early.
func WriteArchive(w io.Writer, img v1.Image, ref string) error {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("ociimage: ref %q: %w", ref, err)
	}
	if tag.Name() != ref {
		return fmt.Errorf("ociimage: ref %q is not fully qualified (it means %q)", ref, tag.Name())
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	mediaType, err := img.MediaType()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mediaType,
			Size:      int64(len(manifest)),
			Digest:    digest,
			Annotations: map[string]string{
				AnnotationImageName: ref,
				AnnotationRefName:   tag.TagStr(),
			},
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
		}},
	})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	modTime := time.Unix(epochSeconds, 0)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: modTime})
	}
	file := func(name string, size int64, body func(io.Writer) error) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: modTime}); err != nil {
			return err
		}
		return body(tw)
	}
	bytesBody := func(b []byte) func(io.Writer) error {
		return func(w io.Writer) error { _, err := w.Write(b); return err }
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	if err := file("index.json", int64(len(index)), bytesBody(index)); err != nil {
		return err
	}
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if err := file("oci-layout", int64(len(layout)), bytesBody(layout)); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	if err := file(blob(digest), int64(len(manifest)), bytesBody(manifest)); err != nil {
		return err
	}
	if err := file(blob(cfgName), int64(len(cfg)), bytesBody(cfg)); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		err = file(blob(h), size, func(w io.Writer) error {
			rc, err := l.Compressed()
			if err != nil {
				return err
			}
			defer rc.Close()
			n, err := io.Copy(w, rc)
			if err == nil && n != size {
				err = fmt.Errorf("layer %s: %d bytes, its descriptor says %d", h, n, size)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("ociimage: %w", err)
		}
	}
	return tw.Close()
}

// WriteArchiveFile writes the archive to path through a temporary file in
// the same directory, so a reader never sees half an archive and a failed
// build leaves the previous one in place.
func WriteArchiveFile(path string, img v1.Image, ref string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := WriteArchive(tmp, img, ref); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
