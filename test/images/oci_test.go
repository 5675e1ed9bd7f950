package images

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/ociimage"
)

// openImage reads the archive of binary and finds in it the image named
// <binary>:<version>.
func openImage(t *testing.T, env imagesEnv, binary string) *ociimage.Image {
	t.Helper()
	archive := filepath.Join(env.dir, binary+"-"+env.version+".tar")
	img, err := ociimage.Open(archive, binary+":"+env.version, t.TempDir())
	require.NoError(t, err, "the archive of make images")
	return img
}

// rootfs unpacks the image's file system and returns its directory.
func rootfs(t *testing.T, img *ociimage.Image) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, img.Unpack(dir))
	return dir
}
