// Package images tests the container images that `make images` builds: it
// unpacks each OCI archive, checks the image's configuration, and runs the
// binary from the image's own file system, mci-apiserver in a local
// ClusterSet. `make test-images` runs it after building the images and
// says where they are and what version they carry.
package images

import (
	"crypto/x509"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// binaries are the images of build/Containerfile.
var binaries = []string{"mci-apiserver", "mci-sidecar", "mci-epp"}

// imagesEnv is what make test-images passes.
type imagesEnv struct {
	// dir holds the archives (MCI_IMAGES_DIR).
	dir string
	// version is the tag and the version stamped in the binaries
	// (MCI_IMAGE_VERSION), revision the commit (MCI_IMAGE_REVISION).
	version, revision string
}

func requireImages(t *testing.T) imagesEnv {
	t.Helper()
	env := imagesEnv{
		dir:      os.Getenv("MCI_IMAGES_DIR"),
		version:  os.Getenv("MCI_IMAGE_VERSION"),
		revision: os.Getenv("MCI_IMAGE_REVISION"),
	}
	if env.dir == "" || env.version == "" || env.revision == "" {
		t.Skip("no images to test: run make test-images, which builds them and sets MCI_IMAGES_DIR, MCI_IMAGE_VERSION and MCI_IMAGE_REVISION")
	}
	return env
}

// The path the images install their binary at, and the CA bundle at the
// path Go's crypto/x509 reads first.
const (
	binDir   = "/usr/local/bin"
	caBundle = "/etc/ssl/certs/ca-certificates.crt"
)

func TestEveryImageIsNonRootLabelledAndRunsItsStampedBinary(t *testing.T) {
	env := requireImages(t)
	for _, binary := range binaries {
		t.Run(binary, func(t *testing.T) {
			img := openImage(t, env, binary)
			t.Logf("%s: %d bytes compressed (%s)", binary, img.CompressedBytes, filepath.Base(img.Archive))

			cfg, err := img.ConfigFile()
			require.NoError(t, err)
			assert.Equal(t, []string{binDir + "/" + binary}, cfg.Config.Entrypoint)
			assert.Empty(t, cfg.Config.Cmd, "flags come from the manifests, not the image")
			uid, _, _ := strings.Cut(cfg.Config.User, ":")
			n, err := strconv.Atoi(uid)
			require.NoError(t, err, "the user is numeric, so that runAsNonRoot can check it: %q", cfg.Config.User)
			assert.NotZero(t, n, "the image runs as a non-root user")
			assert.Equal(t, "linux", cfg.OS)
			labels := cfg.Config.Labels
			assert.Equal(t, env.version, labels["org.opencontainers.image.version"])
			assert.Equal(t, env.revision, labels["org.opencontainers.image.revision"])
			assert.NotEmpty(t, labels["org.opencontainers.image.source"])
			assert.Equal(t, binary, labels["org.opencontainers.image.title"])

			root := rootfs(t, img)
			bundle, err := os.ReadFile(filepath.Join(root, caBundle))
			require.NoError(t, err, "the image carries CA certificates to verify TLS peers (EPPs, member clusters)")
			assert.True(t, x509.NewCertPool().AppendCertsFromPEM(bundle), "%s holds PEM certificates", caBundle)

			path := filepath.Join(root, binDir, binary)
			assertStatic(t, path)
			out, err := exec.Command(path, "--version").CombinedOutput()
			require.NoError(t, err, "%s --version: %s", binary, out)
			want := binary + " " + env.version + " (commit " + env.revision
			assert.True(t, strings.HasPrefix(string(out), want), "%s --version printed %q, want it to start with %q", binary, out, want)
		})
	}
}

// assertStatic checks that the binary needs no dynamic loader: the images
// hold no C library.
func assertStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s is dynamically linked; the image has no loader to run it", path)
	}
}
