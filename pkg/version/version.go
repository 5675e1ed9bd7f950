// Package version says which build of mci is running. The Makefile stamps
// the git description and commit into every binary it builds (and so into
// every image) with -ldflags -X (hack/version.sh prints them); a binary
// built without stamps, by `go run` or a plain `go build`, says so with
// DevVersion and an unknown commit rather than guessing.
package version

import (
	"fmt"
	"runtime"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/klog/v2"
)

// DevVersion is the version of a binary built without stamps.
const DevVersion = "v0.0.0-dev"

// unknownCommit is the commit of a binary built without stamps.
const unknownCommit = "unknown"

// Set at build time with -ldflags "-X github.com/mci-dev/mci/pkg/version.gitVersion=...".
var (
	// gitVersion is `git describe` of the built tree (hack/version.sh).
	gitVersion string
	// gitCommit is the full hash of the built commit.
	gitCommit string
	// gitTreeState is "clean", or "dirty" when the tree had uncommitted
	// changes.
	gitTreeState string
)

// Get returns this build's version in the shape Kubernetes servers serve
// at /version: Major and Minor come from a semantic version and are empty
// for DevVersion.
func Get() apimachineryversion.Info {
	info := apimachineryversion.Info{
		GitVersion:   gitVersion,
		GitCommit:    gitCommit,
		GitTreeState: gitTreeState,
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
	if info.GitVersion == "" {
		info.GitVersion = DevVersion
	}
	if info.GitCommit == "" {
		info.GitCommit = unknownCommit
	}
	if v, err := utilversion.ParseSemantic(info.GitVersion); err == nil && info.GitVersion != DevVersion {
		info.Major = fmt.Sprint(v.Major())
		info.Minor = fmt.Sprint(v.Minor())
	}
	return info
}

// String is the one line that --version prints and that each binary logs
// at start: "v0.3.0-4-g1a2b3c4d5e6f (commit 1a2b3c..., go1.26.8 linux/amd64)".
func String() string {
	info := Get()
	commit := info.GitCommit
	if info.GitTreeState == "dirty" {
		commit += ", dirty tree"
	}
	return fmt.Sprintf("%s (commit %s, %s %s)", info.GitVersion, commit, info.GoVersion, info.Platform)
}

// LogStart logs which build of command is starting, once, so that every
// log says what produced it.
func LogStart(logger klog.Logger, command string) {
	info := Get()
	logger.Info("Starting", "command", command, "version", info.GitVersion, "commit", info.GitCommit, "treeState", info.GitTreeState, "goVersion", info.GoVersion)
}
