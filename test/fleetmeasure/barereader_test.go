package fleetmeasure

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/fields"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	inferencev1alpha1client "github.com/mci-dev/mci/pkg/generated/clientset/versioned/typed/inference/v1alpha1"
)

// A bare reader is what the importer's heap and goroutines per member are
// read against, in the same run: a process of its own (this test binary
// run again) that reads the two summary resources of every member of a
// directory of kubeconfigs with client-go alone, as cheaply as client-go
// reads them: per member one HTTP client (its own TLS connection, as the
// importer has), uncompressed as the importer reads, and per resource a
// reflector and a store, no informer around them. Nothing of what the
// importer adds: no probe, gate, quota, identity, mode or import. It runs
// twice: keeping the summaries decoded in client-go's store, as a stock
// reader does, and keeping nothing of them, which is the floor of any
// reader of a member's summaries over a connection of its own, before
// it keeps anything. It runs a third time keeping nothing of the export
// summaries alone, one reflector a member: what a member's second watch
// costs, and the floor of a reader that would read both summaries
// through one watch.
const (
	bareReaderEnv     = "MCI_FLEET_BARE_READER"
	bareReaderKeepEnv = "MCI_FLEET_BARE_READER_KEEPS"
	bareReaderOneEnv  = "MCI_FLEET_BARE_READER_ONE_WATCH"
	// bareReaderSync bounds how long the bare reader waits for every
	// member's lists: the importer is given 10 minutes to be consistent,
	// a reader with nothing to compute needs far less.
	bareReaderSync = 2 * time.Minute
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(bareReaderEnv); dir != "" {
		if err := runBareReader(dir, bareReading{keeps: os.Getenv(bareReaderKeepEnv) != "", oneWatch: os.Getenv(bareReaderOneEnv) != ""}); err != nil {
			fmt.Fprintln(os.Stderr, "bare reader:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// bareFigures are the bare reader's heap, goroutines and their stacks per
// member: over what the same process held before it read any member.
type bareFigures struct {
	heapPerMember, goroutinesPerMember, stacksPerMember float64
}

// bareReading is what a bare reader reads of each member: both summary
// resources or the export summaries alone (oneWatch), kept decoded or
// not kept.
type bareReading struct {
	keeps, oneWatch bool
}

// measureBareReader runs a bare reader of the members whose kubeconfigs
// are in dir, reading them as r says, until every member is listed and
// its watches are open.
func measureBareReader(t *testing.T, ctx context.Context, dir string, n int, r bareReading) bareFigures {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), bareReaderEnv+"="+dir)
	if r.keeps {
		cmd.Env = append(cmd.Env, bareReaderKeepEnv+"=1")
	}
	if r.oneWatch {
		cmd.Env = append(cmd.Env, bareReaderOneEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		// Closing stdin is what ends the reader.
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the bare reader did not report")
	var heap0, goroutines0, stacks0, heap, goroutines, stacks float64
	_, err = fmt.Sscanf(strings.TrimSpace(line), "%g %g %g %g %g %g", &heap0, &goroutines0, &stacks0, &heap, &goroutines, &stacks)
	require.NoError(t, err, "the bare reader's report %q", line)
	return bareFigures{heapPerMember: (heap - heap0) / float64(n), goroutinesPerMember: (goroutines - goroutines0) / float64(n), stacksPerMember: (stacks - stacks0) / float64(n)}
}

// runBareReader reads every member of dir, then prints its heap,
// goroutines and their stacks before and after, and reads until stdin closes.
func runBareReader(dir string, r bareReading) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	heap0, goroutines0, stacks0 := liveHeap()
	files, err := filepath.Glob(filepath.Join(dir, "*.kubeconfig"))
	if err != nil {
		return err
	}
	var reflectors []*cache.Reflector
	for _, f := range files {
		rs, err := readMember(ctx, f, r)
		if err != nil {
			return err
		}
		reflectors = append(reflectors, rs...)
	}
	deadline := time.Now().Add(bareReaderSync)
	for _, r := range reflectors {
		for r.LastSyncResourceVersion() == "" {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("not every member listed within %s", bareReaderSync)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The watches follow their lists: let them open.
	time.Sleep(2 * time.Second)
	heap, goroutines, stacks := liveHeap()
	if dir := os.Getenv(profilesEnv); dir != "" {
		if err := writeHeapProfile(filepath.Join(dir, fmt.Sprintf("bare-heap-keeps-%t-one-watch-%t.pb.gz", r.keeps, r.oneWatch))); err != nil {
			return err
		}
	}
	fmt.Printf("%d %d %d %d %d %d\n", heap0, goroutines0, stacks0, heap, goroutines, stacks)
	<-ctx.Done()
	runtime.KeepAlive(reflectors)
	return nil
}

// readMember starts a reflector for each summary resource of the member
// whose kubeconfig is file (the export summaries alone with
// r.oneWatch), into a store when r keeps them.
func readMember(ctx context.Context, file string, r bareReading) ([]*cache.Reflector, error) {
	config, err := clientcmd.BuildConfigFromFlags("", file)
	if err != nil {
		return nil, err
	}
	config.DisableCompression = true
	httpClient, err := rest.HTTPClientFor(config)
	if err != nil {
		return nil, err
	}
	client, err := inferencev1alpha1client.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	resources := []struct {
		resource string
		object   apiruntime.Object
	}{
		{"inferencepoolexportsummaries", &v1alpha1.InferencePoolExportSummary{}},
		{"inferenceclustersummaries", &v1alpha1.InferenceClusterSummary{}},
	}
	if r.oneWatch {
		resources = resources[:1]
	}
	var out []*cache.Reflector
	for _, res := range resources {
		lw := cache.NewListWatchFromClient(client.RESTClient(), res.resource, "", fields.Everything())
		var store cache.ReflectorStore = discardingStore{}
		if r.keeps {
			store = cache.NewStore(cache.MetaNamespaceKeyFunc)
		}
		reflector := cache.NewReflector(lw, res.object, store, 0)
		go reflector.RunWithContext(ctx)
		out = append(out, reflector)
	}
	return out, nil
}

// liveHeap is the process's heap after two collections, and its
// goroutines.
func liveHeap() (heap uint64, goroutines int, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, runtime.NumGoroutine(), m.StackInuse
}

// discardingStore is a reflector's store that keeps nothing.
type discardingStore struct{}

func (discardingStore) Add(any) error               { return nil }
func (discardingStore) Update(any) error            { return nil }
func (discardingStore) Delete(any) error            { return nil }
func (discardingStore) Replace([]any, string) error { return nil }
func (discardingStore) Resync() error               { return nil }

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
