// Package release tests `make release` (hack/release.sh) as a person
// cutting a release runs it: into a temporary directory, with a changelog
// of its own, and then reads what it wrote as a user of the release would:
// the OCI archives with go-containerregistry, the binaries inside the images
// with debug/elf and debug/buildinfo, the SBOMs with the CycloneDX library,
// the chart's Chart.yaml from its package, and SHA256SUMS. `make
// test-release` runs it; it needs buildah (hack/install-buildah.sh) and
// builds helm once (hack/build-helm.sh), as make release does.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
	"sigs.k8s.io/yaml"

	"github.com/mci-dev/mci/test/ociimage"
)

const repoRoot = "../.."

// version is a pre-release, so that the test also sees the version reach
// the chart (SemVer without the v) and the tags intact.
const version = "v1.2.3-rc.1"

// changelog is the test's own CHANGELOG.md: the release notes must be
// exactly the section of version, not its neighbours.
const changelog = `# Changelog

## [Unreleased]

- Not released yet.

## v1.2.3-rc.1 - 2026-12-02

The first release candidate.

### Added
- Images for linux/amd64 and linux/arm64.

## v1.2.3-rc.0 - 2026-11-30

- An older candidate.
`

const wantNotes = `The first release candidate.

### Added
- Images for linux/amd64 and linux/arm64.
`

var (
	images    = []string{"mci-apiserver", "mci-sidecar", "mci-epp"}
	platforms = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
)

// refNameAnnotation names an image (or index) in the index of an OCI layout.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// makeRelease runs make release with the changelog fixture and returns its
// output.
func makeRelease(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	changelogPath := filepath.Join(t.TempDir(), "CHANGELOG.md")
	require.NoError(t, os.WriteFile(changelogPath, []byte(changelog), 0o644))
	cmd := exec.Command("make", append([]string{"--no-print-directory", "release", "RELEASE_DIR=" + dir, "CHANGELOG=" + changelogPath}, args...)...)
	cmd.Dir = repoRoot
	// Run from make test-release, the variables of its command line
	// (VERSION=...) would reach this make through MAKEFLAGS.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "MAKEFLAGS" && name != "MFLAGS" && name != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestMakeReleaseRefusesWhatIsNotARelease(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make release")
	}
	for _, tc := range []struct {
		name string
		args []string
		// existing is a file already in the release directory.
		existing bool
		want     string
	}{
		{name: "no version given", want: "make release VERSION=vX.Y.Z"},
		{name: "a version without its v", args: []string{"VERSION=1.2.3"}, want: "VERSION=1.2.3 is not a release version"},
		{name: "a version with build metadata", args: []string{"VERSION=v1.2.3+build.1"}, want: "is not a release version"},
		{name: "a version the changelog has no section for", args: []string{"VERSION=v9.9.9"}, want: "has no section for v9.9.9"},
		{name: "the version of a pre-release without its pre-release", args: []string{"VERSION=v1.2.3"}, want: "has no section for v1.2.3"},
		{name: "a release directory that is not empty", args: []string{"VERSION=" + version}, existing: true, want: "is not empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "release")
			if tc.existing {
				require.NoError(t, os.MkdirAll(dir, 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte("kept"), 0o644))
			}
			out, err := makeRelease(t, dir, tc.args...)
			require.Error(t, err, "make release succeeded:\n%s", out)
			assert.Contains(t, out, tc.want)
			if tc.existing {
				entries, err := os.ReadDir(dir)
				require.NoError(t, err)
				assert.Len(t, entries, 1, "nothing is written beside what was there")
				return
			}
			assert.NoDirExists(t, dir, "nothing is written when the release is refused")
		})
	}
}

func TestMakeReleaseBuildsMultiPlatformImagesChartSBOMsAndChecksums(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make release")
	}
	dir := filepath.Join(t.TempDir(), "release")
	start := time.Now()
	out, err := makeRelease(t, dir, "VERSION="+version)
	require.NoError(t, err, "make release:\n%s", out)
	t.Logf("make release took %s", time.Since(start).Round(time.Second))

	files := checksums(t, dir)
	chart := "mci-" + strings.TrimPrefix(version, "v") + ".tgz"
	want := []string{chart, "release-notes.md"}
	for _, image := range images {
		want = append(want, image+"-"+version+".tar", image+"-"+version+".cdx.json")
	}
	assert.ElementsMatch(t, want, files, "SHA256SUMS names every file of the release")

	notes, err := os.ReadFile(filepath.Join(dir, "release-notes.md"))
	require.NoError(t, err)
	assert.Equal(t, wantNotes, string(notes), "the release notes are the version's section of the changelog")

	appVersion := chartAppVersion(t, filepath.Join(dir, chart))
	assert.Equal(t, version, appVersion, "the chart's appVersion is the release version, the images' tag")

	goMod := goModVersions(t)
	for _, image := range images {
		t.Run(image, func(t *testing.T) {
			binaries := imageBinaries(t, filepath.Join(dir, image+"-"+version+".tar"), image, appVersion)
			assertSBOM(t, filepath.Join(dir, image+"-"+version+".cdx.json"), image, binaries, goMod)
		})
	}
}

// checksums verifies every line of SHA256SUMS and returns the files it names.
func checksums(t *testing.T, dir string) []string {
	t.Helper()
	sums, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	require.NoError(t, err)
	defer sums.Close()
	var names []string
	scanner := bufio.NewScanner(sums)
	for scanner.Scan() {
		sum, name, ok := strings.Cut(scanner.Text(), "  ")
		require.True(t, ok, "a line of SHA256SUMS is <sha256>  <file>: %q", scanner.Text())
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		got := sha256.Sum256(data)
		assert.Equal(t, sum, hex.EncodeToString(got[:]), "the checksum of %s", name)
		names = append(names, name)
	}
	require.NoError(t, scanner.Err())

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var present []string
	for _, e := range entries {
		if e.Name() != "SHA256SUMS" {
			present = append(present, e.Name())
		}
	}
	assert.ElementsMatch(t, present, names, "SHA256SUMS covers exactly the files of the release")
	return names
}

// chartAppVersion reads Chart.yaml from the packaged chart, checks its
// version and returns its appVersion.
func chartAppVersion(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		require.NoError(t, err, "the chart package has no mci/Chart.yaml")
		if hdr.Name != "mci/Chart.yaml" {
			continue
		}
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		var chart struct {
			Version    string `json:"version"`
			AppVersion string `json:"appVersion"`
		}
		require.NoError(t, yaml.Unmarshal(data, &chart))
		assert.Equal(t, strings.TrimPrefix(version, "v"), chart.Version, "the chart's version is the release's, as SemVer (no v)")
		return chart.AppVersion
	}
}

// builtBinary is a binary as an image of the release holds it.
type builtBinary struct {
	arch string
	info *debug.BuildInfo
}

// imageBinaries opens the OCI archive of image, checks that it holds an
// index named <image>:<version> with an image for every platform, each
// labelled appVersion, holding a binary of its architecture, and returns
// those binaries' build information.
func imageBinaries(t *testing.T, archive, image, appVersion string) []builtBinary {
	t.Helper()
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer f.Close()
	layoutDir := t.TempDir()
	require.NoError(t, ociimage.Untar(f, layoutDir), "unpacking %s", archive)
	root, err := layout.ImageIndexFromPath(layoutDir)
	require.NoError(t, err, "%s is not an OCI layout", archive)
	rootManifest, err := root.IndexManifest()
	require.NoError(t, err)
	require.Len(t, rootManifest.Manifests, 1, "the archive holds one index")
	desc := rootManifest.Manifests[0]
	assert.Equal(t, image+":"+version, desc.Annotations[refNameAnnotation])
	require.True(t, desc.MediaType.IsIndex(), "%s holds %s, not an image index", archive, desc.MediaType)

	index, err := root.ImageIndex(desc.Digest)
	require.NoError(t, err)
	manifest, err := index.IndexManifest()
	require.NoError(t, err)
	seen := map[string]bool{}
	var binaries []builtBinary
	for _, m := range manifest.Manifests {
		require.NotNil(t, m.Platform, "every image of the index names its platform")
		assert.Equal(t, "linux", m.Platform.OS)
		arch := m.Platform.Architecture
		require.Contains(t, platforms, arch, "an image for an unexpected architecture")
		assert.False(t, seen[arch], "two images for %s", arch)
		seen[arch] = true

		img, err := index.Image(m.Digest)
		require.NoError(t, err)
		cfg, err := img.ConfigFile()
		require.NoError(t, err)
		assert.Equal(t, arch, cfg.Architecture, "the configuration's architecture is the index's")
		assert.Equal(t, appVersion, cfg.Config.Labels["org.opencontainers.image.version"], "the image's version label is the chart's appVersion")
		t.Logf("%s %s/%s: %d bytes compressed", image, m.Platform.OS, arch, compressedSize(t, img))

		path := extractBinary(t, img, "usr/local/bin/"+image)
		ef, err := elf.Open(path)
		require.NoError(t, err)
		assert.Equal(t, platforms[arch], ef.Machine, "the %s binary is an ELF of its machine", arch)
		require.NoError(t, ef.Close())
		info, err := buildinfo.ReadFile(path)
		require.NoError(t, err)
		binaries = append(binaries, builtBinary{arch: arch, info: info})
	}
	for arch := range platforms {
		assert.True(t, seen[arch], "the index of %s has no image for linux/%s", image, arch)
	}
	return binaries
}

// compressedSize is what a registry stores and a node pulls for img: its
// layers and configuration.
func compressedSize(t *testing.T, img v1.Image) int64 {
	m, err := img.Manifest()
	require.NoError(t, err)
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size
}

// extractBinary writes the file at path of img's flattened file system to
// a temporary file and returns its name.
func extractBinary(t *testing.T, img v1.Image, path string) string {
	t.Helper()
	fs := mutate.Extract(img)
	defer fs.Close()
	tr := tar.NewReader(fs)
	for {
		hdr, err := tr.Next()
		require.NoError(t, err, "the image has no %s", path)
		if strings.TrimPrefix(filepath.Clean(hdr.Name), "/") != path {
			continue
		}
		out := filepath.Join(t.TempDir(), filepath.Base(path))
		require.NoError(t, writeFile(out, tr))
		return out
	}
}

// goModVersions is the version go.mod requires of each module.
func goModVersions(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	require.NoError(t, err)
	f, err := modfile.Parse("go.mod", data, nil)
	require.NoError(t, err)
	require.Empty(t, f.Replace, "go.mod replaces no module; the SBOM check below compares paths as required")
	versions := map[string]string{}
	for _, r := range f.Require {
		versions[r.Mod.Path] = r.Mod.Version
	}
	return versions
}

// assertSBOM checks that the SBOM of image describes the release version
// and lists every module linked into its binaries at the version go.mod
// requires, and nothing else.
func assertSBOM(t *testing.T, path, image string, binaries []builtBinary, goMod map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var bom cdx.BOM
	require.NoError(t, cdx.NewBOMDecoder(f, cdx.BOMFileFormatJSON).Decode(&bom), "%s is a CycloneDX JSON document", path)
	require.NotNil(t, bom.Metadata)
	require.NotNil(t, bom.Metadata.Component)
	assert.Equal(t, image, bom.Metadata.Component.Name)
	assert.Equal(t, version, bom.Metadata.Component.Version)
	require.NotNil(t, bom.Components)

	listed := map[string]string{}
	for _, c := range *bom.Components {
		listed[c.Name] = c.Version
	}
	linked := map[string]string{"std": binaries[0].info.GoVersion}
	for _, b := range binaries {
		for _, dep := range b.info.Deps {
			linked[dep.Path] = dep.Version
		}
	}
	assert.Equal(t, linked, listed, "the SBOM lists exactly the modules linked into the image's binaries and the standard library")
	require.Greater(t, len(listed), 10, "the binaries link more than a handful of modules")

	for name, v := range listed {
		if name == "std" {
			continue
		}
		want, ok := goMod[name]
		if assert.True(t, ok, "%s is linked into %s but go.mod does not require it", name, image) {
			assert.Equal(t, want, v, "the SBOM lists %s at the version go.mod requires", name)
		}
	}
	t.Logf("%s: the SBOM lists %d modules and the standard library", image, len(listed)-1)
}

func writeFile(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, r); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
