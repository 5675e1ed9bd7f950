// Package ociimage reads the images that `make images` builds
// (hack/build-images.sh): OCI archives of one image each, named
// <binary>:<version> in the archive's index. Tests open an archive, find
// the image by its reference, and unpack its file system to run its
// binary as a container runtime would.
package ociimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// RefNameAnnotation names an image in the index of an OCI layout.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// Image is one image of an OCI archive.
type Image struct {
	// Archive is the file it was read from.
	Archive string
	v1.Image
	// CompressedBytes is the sum of the manifest's layer and config sizes,
	// what a registry stores and a node pulls.
	CompressedBytes int64
}

// Open unpacks the OCI archive into dir (which must exist and be empty;
// the image's blobs are read from there while the Image is used) and
// returns the image of the archive's index named ref (<name>:<tag>).
func Open(archive, ref, dir string) (*Image, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := Untar(f, dir); err != nil {
		return nil, fmt.Errorf("unpacking %s: %w", archive, err)
	}
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI layout: %w", archive, err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	var names []string
	for _, desc := range manifest.Manifests {
		name := desc.Annotations[RefNameAnnotation]
		names = append(names, name)
		if name != ref {
			continue
		}
		img, err := index.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("%s: image %s: %w", archive, ref, err)
		}
		m, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("%s: image %s: %w", archive, ref, err)
		}
		size := m.Config.Size
		for _, l := range m.Layers {
			size += l.Size
		}
		return &Image{Archive: archive, Image: img, CompressedBytes: size}, nil
	}
	return nil, fmt.Errorf("%s holds %q, not %s", archive, names, ref)
}

// Unpack writes the image's file system (its layers, flattened) under
// dir, which must exist.
func (i *Image) Unpack(dir string) error {
	fs := mutate.Extract(i.Image)
	defer fs.Close()
	if err := Untar(fs, dir); err != nil {
		return fmt.Errorf("unpacking the file system of %s: %w", i.Archive, err)
	}
	return nil
}

// Untar writes the directories and regular files of a tar stream under
// dir. The images hold nothing else; any other entry, or a path leaving
// dir, is an error.
func Untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(hdr.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q leaves the archive's root", hdr.Name)
		}
		path := filepath.Join(dir, name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := writeFile(path, tr, hdr.FileInfo().Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: unexpected type %q", hdr.Name, hdr.Typeflag)
		}
	}
}

func writeFile(path string, r io.Reader, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
