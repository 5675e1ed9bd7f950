package images

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/require"
)

// refNameAnnotation names an image in the index of an OCI layout.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// builtImage is one image of `make images`, read from its OCI archive.
type builtImage struct {
	binary  string
	archive string
	image   v1.Image
	// compressedBytes is the sum of the manifest's layer and config sizes,
	// what a registry stores and a node pulls.
	compressedBytes int64
}

// openImage reads the archive of binary and finds in it the image named
// <binary>:<version>.
func openImage(t *testing.T, env imagesEnv, binary string) *builtImage {
	t.Helper()
	archive := filepath.Join(env.dir, binary+"-"+env.version+".tar")
	f, err := os.Open(archive)
	require.NoError(t, err, "the archive of make images")
	defer f.Close()
	dir := t.TempDir()
	require.NoError(t, untar(f, dir), "unpacking %s", archive)

	index, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err, "%s is not an OCI layout", archive)
	manifest, err := index.IndexManifest()
	require.NoError(t, err)
	want := binary + ":" + env.version
	var names []string
	for _, desc := range manifest.Manifests {
		names = append(names, desc.Annotations[refNameAnnotation])
		if desc.Annotations[refNameAnnotation] != want {
			continue
		}
		img, err := index.Image(desc.Digest)
		require.NoError(t, err)
		m, err := img.Manifest()
		require.NoError(t, err)
		size := m.Config.Size
		for _, l := range m.Layers {
			size += l.Size
		}
		return &builtImage{binary: binary, archive: archive, image: img, compressedBytes: size}
	}
	require.Failf(t, "image not found", "%s holds %q, not %s", archive, names, want)
	return nil
}

// rootfs unpacks the image's file system (its layers, flattened) and
// returns its directory.
func (b *builtImage) rootfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	fs := mutate.Extract(b.image)
	defer fs.Close()
	require.NoError(t, untar(fs, dir), "unpacking the file system of %s", b.archive)
	return dir
}

// untar writes the directories and regular files of a tar stream under
// dir. The images hold nothing else; any other entry, or a path leaving
// dir, is an error.
func untar(r io.Reader, dir string) error {
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
