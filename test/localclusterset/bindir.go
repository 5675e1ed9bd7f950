package localclusterset

import (
	"fmt"
	"os"
	"path/filepath"
)

// BinDirEnv names the variable that says where the binaries are: the kube
// tools (hack/build-kube-tools.sh) and the mci binaries (`make build`).
const BinDirEnv = "MCI_BIN_DIR"

// BinDir is the one place the tests learn where the binaries are:
// $MCI_BIN_DIR, else _output/bin of this repository (where `make build
// tools` puts them), as an absolute path. When MCI_BIN_DIR is unset and
// there is no _output/bin, the error says how to get one.
func BinDir() (string, error) {
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", fmt.Errorf("%s is unset and %w", BinDirEnv, err)
		}
		dir = filepath.Join(root, "_output", "bin")
		if _, err := os.Stat(dir); err != nil {
			return "", fmt.Errorf("%s is unset and %s does not exist: run `make build tools`, or set %s to the directory of kube-apiserver, etcd and the mci binaries", BinDirEnv, dir, BinDirEnv)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("%s: %w", BinDirEnv, err)
	}
	return abs, nil
}

// Binary is the path of the binary name of BinDir, or an error saying
// which is missing and how to build it.
func Binary(name string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is missing (%v): run `make build` (or set %s)", path, err, BinDirEnv)
	}
	return path, nil
}
