package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ReadArchiveIndex returns the index.json of an OCI archive, reading no
// further than that entry (WriteArchive puts it first).
func ReadArchiveIndex(r io.Reader) (*v1.IndexManifest, error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("ociimage: archive has no index.json")
		}
		if err != nil {
			return nil, fmt.Errorf("ociimage: reading archive: %w", err)
		}
		if path.Clean(hdr.Name) == "index.json" {
			return v1.ParseIndexManifest(tr)
		}
	}
}

// ReadArchive reads an OCI archive holding one image (as WriteArchive
// writes) into memory and returns the image and the index. Blobs are not
// verified here: validate.Image checks every digest and size.
func ReadArchive(r io.Reader) (v1.Image, *v1.IndexManifest, error) {
	var index *v1.IndexManifest
	blobs := map[v1.Hash][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("ociimage: reading archive: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if isSparse(hdr) {
			// A few bytes can declare gigabytes of holes; WriteArchive
			// never writes sparse entries.
			return nil, nil, fmt.Errorf("ociimage: %s is a sparse file", hdr.Name)
		}
		name := path.Clean(hdr.Name)
		switch dir, file := path.Split(name); {
		case name == "index.json":
			if index, err = v1.ParseIndexManifest(tr); err != nil {
				return nil, nil, fmt.Errorf("ociimage: index.json: %w", err)
			}
		case dir == "blobs/sha256/":
			h, err := v1.NewHash("sha256:" + file)
			if err != nil {
				return nil, nil, fmt.Errorf("ociimage: blob %s: %w", name, err)
			}
			if blobs[h], err = io.ReadAll(tr); err != nil {
				return nil, nil, fmt.Errorf("ociimage: blob %s: %w", name, err)
			}
		}
	}
	if index == nil {
		return nil, nil, errors.New("ociimage: archive has no index.json")
	}
	if len(index.Manifests) != 1 {
		return nil, nil, fmt.Errorf("ociimage: index.json lists %d manifests, want 1", len(index.Manifests))
	}
	desc := index.Manifests[0]
	manifest, ok := blobs[desc.Digest]
	if !ok {
		return nil, nil, fmt.Errorf("ociimage: manifest %s is not in the archive", desc.Digest)
	}
	m, err := v1.ParseManifest(bytes.NewReader(manifest))
	if err != nil {
		return nil, nil, fmt.Errorf("ociimage: manifest: %w", err)
	}
	img, err := partial.CompressedToImage(&archiveImage{blobs: blobs, raw: manifest, manifest: m, mediaType: desc.MediaType})
	if err != nil {
		return nil, nil, err
	}
	return img, index, nil
}

// isSparse reports a PAX sparse entry (GNU.sparse.* records): its regular
// file type hides holes that read back as zeros.
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// archiveImage is an image whose blobs are held in memory, the minimum
// go-containerregistry needs (partial.CompressedImageCore) to provide the
// rest of v1.Image.
type archiveImage struct {
	blobs     map[v1.Hash][]byte
	raw       []byte
	manifest  *v1.Manifest
	mediaType types.MediaType
}

func (a *archiveImage) RawManifest() ([]byte, error)        { return a.raw, nil }
func (a *archiveImage) MediaType() (types.MediaType, error) { return a.mediaType, nil }

func (a *archiveImage) RawConfigFile() ([]byte, error) {
	b, ok := a.blobs[a.manifest.Config.Digest]
	if !ok {
		return nil, fmt.Errorf("ociimage: config %s is not in the archive", a.manifest.Config.Digest)
	}
	return b, nil
}

func (a *archiveImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range a.manifest.Layers {
		if l.Digest != h {
			continue
		}
		b, ok := a.blobs[h]
		if !ok {
			return nil, fmt.Errorf("ociimage: layer %s is not in the archive", h)
		}
		return archiveLayer{desc: l, data: b}, nil
	}
	return nil, fmt.Errorf("ociimage: the manifest has no layer %s", h)
}

// archiveLayer is one compressed layer blob with its manifest descriptor.
type archiveLayer struct {
	desc v1.Descriptor
	data []byte
}

func (l archiveLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l archiveLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l archiveLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l archiveLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.data)), nil
}
