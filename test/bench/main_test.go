// Package bench measures mci-apiserver against its baselines on a real
// local ClusterSet, each comparison interleaved in the same run:
//
//   - convergence: an export change in cluster-a seen by a watch through
//     cluster-b's kube-apiserver, against a write and watch on one
//     kube-apiserver (the single-hop floor);
//   - LIST of 10,000 imports through the aggregator, against LIST of
//     10,000 equivalent custom resources from a kube-apiserver;
//   - mci-apiserver heap growth from 10,000 unrelated Services and
//     EndpointSlices in a member.
//
// Run with `make bench` (go test -run '^$' -bench . -benchtime=1x). The
// ClusterSet is started only when benchmarks run.
package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mci-dev/mci/test/clusterset"
)

var clusters *clusterset.ClusterSet

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	binDir := os.Getenv("MCI_BIN_DIR")
	if binDir == "" {
		binDir = filepath.Join("..", "..", "_output", "bin")
	}
	binDir, _ = filepath.Abs(binDir)
	dir, err := os.MkdirTemp("", "mci-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if os.Getenv("MCI_BENCH_KEEP") == "" {
			os.RemoveAll(dir)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	clusters, err = clusterset.Up(ctx, clusterset.Options{
		Dir:                dir,
		Clusters:           []string{"cluster-a", "cluster-b"},
		BinDir:             binDir,
		MCIAPIServerBinary: filepath.Join(binDir, "mci-apiserver"),
		Log:                os.Stderr,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: starting the local ClusterSet: %v\n", err)
		return 1
	}
	defer clusters.Stop()
	return m.Run()
}
