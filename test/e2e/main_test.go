// Package e2e tests mci against a real local ClusterSet: three
// kube-apiservers sharing one etcd, each with an mci-apiserver registered
// through the aggregator. Every request goes through a cluster's
// kube-apiserver, as a user's would.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mci-dev/mci/test/localclusterset"
)

// clusters is the ClusterSet every test in this package shares. Tests use
// namespaces of their own so that they do not see each other's pools.
var clusters *localclusterset.ClusterSet

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	binDir, err := localclusterset.BinDir()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	mci, err := localclusterset.Binary("mci-apiserver")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v (or run `make test-e2e`)\n", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "mci-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	clusters, err = localclusterset.Up(ctx, localclusterset.Options{
		Dir:                dir,
		BinDir:             binDir,
		MCIAPIServerBinary: mci,
		// Every mci-apiserver reads the other members through their
		// summaries (the default, since each runs mci-apiserver), and may
		// read nothing else of them: a server that still watched a
		// member's objects would be refused and never list it.
		SummaryReaderOnly: true,
		Log:               os.Stderr,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: starting the local ClusterSet: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: ClusterSet up in %s\n", time.Since(start).Round(time.Second))
	code := m.Run()
	if err := clusters.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stopping the ClusterSet: %v\n", err)
	}
	if code == 0 {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", filepath.Join(dir, "logs"))
	}
	return code
}
