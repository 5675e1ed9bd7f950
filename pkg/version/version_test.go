package version

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
)

// stamp sets the -X variables for one test, as the Makefile's -ldflags do.
func stamp(t *testing.T, version, commit, treeState string) {
	t.Helper()
	saved := [3]string{gitVersion, gitCommit, gitTreeState}
	gitVersion, gitCommit, gitTreeState = version, commit, treeState
	t.Cleanup(func() { gitVersion, gitCommit, gitTreeState = saved[0], saved[1], saved[2] })
}

func TestGet(t *testing.T) {
	tests := []struct {
		name                    string
		version, commit, state  string
		wantVersion, wantCommit string
		wantMajor, wantMinor    string
		wantStringPrefix        string
	}{{
		name:        "a build without stamps says it is a dev build of an unknown commit",
		wantVersion: DevVersion, wantCommit: "unknown",
		wantStringPrefix: "v0.0.0-dev (commit unknown, go",
	}, {
		name:    "a stamped build past a tag reports the tag's major and minor",
		version: "v0.3.0-4-g1a2b3c4d5e6f", commit: "1a2b3c4d5e6f7a8b9c0d", state: "clean",
		wantVersion: "v0.3.0-4-g1a2b3c4d5e6f", wantCommit: "1a2b3c4d5e6f7a8b9c0d",
		wantMajor: "0", wantMinor: "3",
		wantStringPrefix: "v0.3.0-4-g1a2b3c4d5e6f (commit 1a2b3c4d5e6f7a8b9c0d, go",
	}, {
		name:    "a build of a dirty tree says so",
		version: "v1.2.0-dirty", commit: "abc", state: "dirty",
		wantVersion: "v1.2.0-dirty", wantCommit: "abc",
		wantMajor: "1", wantMinor: "2",
		wantStringPrefix: "v1.2.0-dirty (commit abc, dirty tree, go",
	}, {
		name:    "a version that is not semantic has no major or minor",
		version: "b301ae4", commit: "b301ae4bf1bb", state: "clean",
		wantVersion: "b301ae4", wantCommit: "b301ae4bf1bb",
		wantStringPrefix: "b301ae4 (commit b301ae4bf1bb, go",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stamp(t, tc.version, tc.commit, tc.state)
			info := Get()
			assert.Equal(t, tc.wantVersion, info.GitVersion)
			assert.Equal(t, tc.wantCommit, info.GitCommit)
			assert.Equal(t, tc.wantMajor, info.Major)
			assert.Equal(t, tc.wantMinor, info.Minor)
			assert.NotEmpty(t, info.GoVersion)
			assert.NotEmpty(t, info.Platform)
			assert.True(t, strings.HasPrefix(String(), tc.wantStringPrefix), "String() = %q", String())
		})
	}
}

func TestVersionFlagPrintsTheVersionAndRunsNothing(t *testing.T) {
	stamp(t, "v0.3.0", "1a2b3c", "clean")
	ran := false
	cmd := &cobra.Command{Use: "mci-test", RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	AddFlag(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"})
	require.NoError(t, cmd.Execute())
	assert.False(t, ran, "--version runs nothing else")
	assert.Equal(t, "mci-test "+String()+"\n", out.String())
	require.NotNil(t, cmd.Flags().Lookup("version"), "the flag is declared with the command's other flags, for the flag reference")
}

func TestServedReportsMCIAndKeepsTheKubernetesVersions(t *testing.T) {
	stamp(t, "v0.3.0-4-g1a2b3c4d5e6f", "1a2b3c4d5e6f", "clean")
	kube := utilcompatibility.DefaultBuildEffectiveVersion()
	served := Served(kube)
	info := served.Info()
	require.NotNil(t, info)
	assert.Equal(t, "v0.3.0-4-g1a2b3c4d5e6f", info.GitVersion)
	assert.Equal(t, "1a2b3c4d5e6f", info.GitCommit)
	assert.Equal(t, "0", info.Major)
	assert.Equal(t, "3", info.Minor)
	assert.Equal(t, kube.BinaryVersion(), served.BinaryVersion(), "features are gated by the Kubernetes libraries' version")
	assert.Equal(t, kube.EmulationVersion(), served.EmulationVersion())
}
