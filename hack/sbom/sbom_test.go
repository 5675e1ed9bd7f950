package main

import (
	"bytes"
	"os"
	"runtime/debug"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// build is the build information of mci-apiserver for goarch, stamped
// version.
func build(goarch, version string, deps ...*debug.Module) Binary {
	return Binary{
		Path: "bin/linux_" + goarch + "/mci-apiserver",
		Info: &debug.BuildInfo{
			GoVersion: "go1.26.8",
			Path:      "github.com/mci-dev/mci/cmd/mci-apiserver",
			Main:      debug.Module{Path: "github.com/mci-dev/mci", Version: "(devel)"},
			Deps:      deps,
			Settings: []debug.BuildSetting{
				{Key: "-ldflags", Value: "-s -w -X " + versionVar + "=" + version + " -X github.com/mci-dev/mci/pkg/version.gitCommit=abc"},
				{Key: "GOOS", Value: "linux"},
				{Key: "GOARCH", Value: goarch},
				{Key: "vcs.revision", Value: "abc"},
			},
		},
	}
}

var (
	apimachinery = &debug.Module{Path: "k8s.io/apimachinery", Version: "v0.37.2", Sum: "h1:x"}
	sys          = &debug.Module{Path: "golang.org/x/sys", Version: "v0.49.0", Sum: "h1:y"}
	fork         = &debug.Module{Path: "github.com/example/lib", Version: "v1.0.0", Replace: &debug.Module{Path: "github.com/fork/lib", Version: "v1.0.1"}}
)

func versions(bom *cdx.BOM) map[string]string {
	got := map[string]string{}
	for _, c := range *bom.Components {
		got[c.Name] = c.Version
	}
	return got
}

func TestBuildListsEveryLinkedModuleOfEveryPlatformOnce(t *testing.T) {
	bom, err := Build("mci-apiserver", "v1.2.3", time.Unix(0, 0), []Binary{
		build("amd64", "v1.2.3", apimachinery),
		build("arm64", "v1.2.3", apimachinery, sys),
	})
	require.NoError(t, err)

	assert.Equal(t, map[string]string{"k8s.io/apimachinery": "v0.37.2", "golang.org/x/sys": "v0.49.0", "std": "go1.26.8"}, versions(bom))
	app := bom.Metadata.Component
	assert.Equal(t, "mci-apiserver", app.Name)
	assert.Equal(t, "v1.2.3", app.Version)
	assert.Equal(t, "pkg:golang/github.com/mci-dev/mci@v1.2.3#cmd/mci-apiserver", app.PackageURL)
	assert.Contains(t, *app.Properties, cdx.Property{Name: "mci:platform", Value: "linux/arm64"})
	assert.Contains(t, *app.Properties, cdx.Property{Name: "mci:platform", Value: "linux/amd64"})
	assert.Equal(t, "1970-01-01T00:00:00Z", bom.Metadata.Timestamp)
	require.Len(t, *bom.Dependencies, 1)
	assert.Len(t, *(*bom.Dependencies)[0].Dependencies, 3, "the application depends on every component")
}

func TestBuildListsAReplacedModuleAsItsReplacement(t *testing.T) {
	bom, err := Build("mci-apiserver", "v1.2.3", time.Unix(0, 0), []Binary{build("amd64", "v1.2.3", fork)})
	require.NoError(t, err)
	assert.Equal(t, "v1.0.1", versions(bom)["github.com/fork/lib"])
	assert.NotContains(t, versions(bom), "github.com/example/lib")
}

func TestBuildRefusesBinariesThatAreNotOneRelease(t *testing.T) {
	otherPackage := build("arm64", "v1.2.3")
	otherPackage.Info.Path = "github.com/mci-dev/mci/cmd/mci-epp"
	otherCommit := build("arm64", "v1.2.3")
	otherCommit.Info.Settings[len(otherCommit.Info.Settings)-1].Value = "def"
	directoryReplacement := &debug.Module{Path: "github.com/example/lib", Version: "v1.0.0", Replace: &debug.Module{Path: "../lib"}}

	for _, tc := range []struct {
		name     string
		binaries []Binary
		want     string
	}{
		{name: "no binary", want: "no binary"},
		{name: "another version stamped", binaries: []Binary{build("amd64", "v1.2.3"), build("arm64", "v1.2.4")}, want: "stamped v1.2.4, not the release version v1.2.3"},
		{name: "another package", binaries: []Binary{build("amd64", "v1.2.3"), otherPackage}, want: "not builds of one image"},
		{name: "another commit", binaries: []Binary{build("amd64", "v1.2.3"), otherCommit}, want: "not builds of one commit"},
		{name: "a module replaced by a directory", binaries: []Binary{build("amd64", "v1.2.3", directoryReplacement)}, want: "has no version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build("mci-apiserver", "v1.2.3", time.Unix(0, 0), tc.binaries)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestTheDocumentIsDeterministicAndDecodesAsCycloneDX(t *testing.T) {
	encode := func() []byte {
		bom, err := Build("mci-apiserver", "v1.2.3", time.Unix(1764633600, 0), []Binary{build("amd64", "v1.2.3", sys, apimachinery)})
		require.NoError(t, err)
		var buf bytes.Buffer
		require.NoError(t, Encode(&buf, bom))
		return buf.Bytes()
	}
	first := encode()
	assert.Equal(t, first, encode(), "the same binaries give the same document")

	var decoded cdx.BOM
	require.NoError(t, cdx.NewBOMDecoder(bytes.NewReader(first), cdx.BOMFileFormatJSON).Decode(&decoded))
	assert.Equal(t, cdx.SpecVersion1_6, decoded.SpecVersion)
	assert.Regexp(t, `^urn:uuid:[0-9a-f-]{36}$`, decoded.SerialNumber)
	assert.Equal(t, "v0.37.2", versions(&decoded)["k8s.io/apimachinery"])
}

func TestReadBinaryReadsTheBuildInformationOfAGoBinary(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	b, err := ReadBinary(self)
	require.NoError(t, err)
	assert.Equal(t, "github.com/mci-dev/mci", b.Info.Main.Path)

	_, err = ReadBinary("sbom_test.go")
	assert.ErrorContains(t, err, "reading the build information of sbom_test.go")
}
