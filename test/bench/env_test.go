package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/bench/crdfanout"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
)

// importGVR is the virtual InferencePoolImport that mci-apiserver serves
// through each cluster's aggregator.
var importGVR = schema.GroupVersionResource{Group: localclusterset.MCIGroup, Version: localclusterset.MCIVersion, Resource: "inferencepoolimports"}

// env is a running local ClusterSet and admin clients of each member.
type env struct {
	cs    *localclusterset.ClusterSet
	names []string
	cfg   map[string]*rest.Config
	kube  map[string]kubernetes.Interface
	mci   map[string]mciclient.Interface
	dyn   map[string]dynamic.Interface
}

// clusterNames are cluster-a, cluster-b, ... cluster-z, cluster-aa, ...:
// cluster-a exports, cluster-b observes.
func clusterNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		if i < 26 {
			names[i] = fmt.Sprintf("cluster-%c", 'a'+i)
		} else {
			names[i] = fmt.Sprintf("cluster-%c%c", 'a'+i/26-1, 'a'+i%26)
		}
	}
	return names
}

// startClusterSet runs a ClusterSet of n clusters, each with its
// mci-apiserver, until the benchmark ends.
func startClusterSet(b *testing.B, n int) *env {
	b.Helper()
	binDir, err := localclusterset.BinDir()
	require.NoError(b, err)
	dir, err := os.MkdirTemp("", fmt.Sprintf("mci-bench-%d-", n))
	require.NoError(b, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{
		Dir:                dir,
		Clusters:           clusterNames(n),
		BinDir:             binDir,
		MCIAPIServerBinary: filepath.Join(binDir, "mci-apiserver"),
		MemberSummariesOf:  readerModes(clusterNames(n)),
		Log:                progressLog{},
	})
	require.NoError(b, err, "starting a local ClusterSet of %d clusters", n)
	b.Cleanup(func() {
		if err := cs.Stop(); err != nil {
			b.Errorf("stopping the ClusterSet: %v", err)
		}
		if os.Getenv("MCI_BENCH_KEEP") == "" {
			_ = os.RemoveAll(dir)
		} else {
			b.Logf("ClusterSet kept in %s", dir)
		}
	})
	logf("ClusterSet of %d clusters up in %s", n, time.Since(start).Round(time.Second))
	e := &env{cs: cs, names: cs.Names(), cfg: map[string]*rest.Config{}, kube: map[string]kubernetes.Interface{},
		mci: map[string]mciclient.Interface{}, dyn: map[string]dynamic.Interface{}}
	for _, c := range cs.Clusters {
		cfg := rest.CopyConfig(c.Config)
		cfg.QPS, cfg.Burst = 2000, 4000
		e.cfg[c.Name] = cfg
		e.kube[c.Name] = kubernetes.NewForConfigOrDie(cfg)
		e.mci[c.Name] = mciclient.NewForConfigOrDie(cfg)
		e.dyn[c.Name] = dynamic.NewForConfigOrDie(cfg)
	}
	// The baseline's CRD, everywhere, once.
	for _, name := range e.names {
		_, err := e.dyn[name].Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}).
			Create(context.Background(), crdfanout.CRD(), metav1.CreateOptions{})
		require.NoError(b, err)
	}
	for _, name := range e.names {
		require.NoError(b, wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := e.dyn[name].Resource(crdfanout.GVR).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil, nil
		}), "the baseline CRD is not served in %s", name)
	}
	return e
}

// progressLog prints the ClusterSet's progress lines with the run's clock.
type progressLog struct{}

func (progressLog) Write(p []byte) (int, error) {
	logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var runStart = time.Now()

// logf prints a progress line: the benchmark runs for minutes and a person
// watching it should see where it is.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %6.1fs] %s\n", time.Since(runStart).Seconds(), fmt.Sprintf(format, args...))
}

// namespaceEverywhere creates ns in every member: namespace sameness, so
// every member imports.
func (e *env) namespaceEverywhere(b *testing.B, ns string) {
	b.Helper()
	for _, name := range e.names {
		_, err := e.kube[name].CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(b, err)
		}
	}
}

func pool(ns, name string, exported bool) *poolv1.InferencePool {
	p := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"bench": "mci"}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: name + "-epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	if exported {
		p.Annotations = map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
	}
	return p
}

// exportPatch sets or removes the export annotation.
func exportPatch(on bool) []byte {
	if on {
		return []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.ExportAnnotation, v1alpha1.ExportScopeClusterSet))
	}
	return []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.ExportAnnotation))
}

// parallel runs f for 0..n-1 on workers goroutines and returns the first
// error; AlreadyExists counts as done, so a step can be rerun.
func parallel(n, workers int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range max(workers, 1) {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil && !apierrors.IsAlreadyExists(err) {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// apiServerMetrics reads cluster's kube-apiserver /metrics.
func (e *env) apiServerMetrics(ctx context.Context, cluster string) (promtext.Metrics, error) {
	body, err := e.kube[cluster].Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return promtext.Parse(body)
}

// writeVerbs are the apiserver_request_total verbs that change state.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

// backgroundWrites are resources the kube-apiserver writes by itself on a
// timer (its identity lease, the aggregator's APIService conditions, the
// priority-and-fairness configuration), whatever the benchmark does.
var backgroundWrites = map[string]bool{"leases": true, "apiservices": true, "flowschemas": true, "prioritylevelconfigurations": true}

// writeCounts sums, per cluster and per resource (with its subresource:
// "inferencepools/status.inference.networking.k8s.io"), the write requests
// every member's kube-apiserver has served, background writes excluded.
func (e *env) writeCounts(b *testing.B) map[string]map[string]float64 {
	b.Helper()
	out := map[string]map[string]float64{}
	for _, name := range e.names {
		m, err := e.apiServerMetrics(context.Background(), name)
		require.NoError(b, err)
		counts := map[string]float64{}
		for _, s := range m.Samples("apiserver_request_total") {
			if !writeVerbs[s.Labels["verb"]] || backgroundWrites[s.Labels["resource"]] {
				continue
			}
			key := s.Labels["resource"]
			if s.Labels["subresource"] != "" {
				key += "/" + s.Labels["subresource"]
			}
			if s.Labels["group"] != "" {
				key += "." + s.Labels["group"]
			}
			counts[key] += s.Value
		}
		out[name] = counts
	}
	return out
}

func diffCounts(before, after map[string]float64) (total float64, by map[string]float64) {
	by = map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			by[k] = d
			total += d
		}
	}
	return total, by
}

// watchConnections is how many WATCH requests cluster's kube-apiserver is
// serving.
func (e *env) watchConnections(b *testing.B, cluster string) float64 {
	b.Helper()
	m, err := e.apiServerMetrics(context.Background(), cluster)
	require.NoError(b, err)
	return m.Sum("apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})
}

// mciHTTP is a client of an mci-apiserver's own port, as the admin user
// (whom the server authorizes through its cluster).
func (e *env) mciHTTP(b *testing.B) *http.Client {
	b.Helper()
	pki := filepath.Join(e.cs.Dir, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	require.NoError(b, err)
	caPEM, err := os.ReadFile(filepath.Join(pki, "mci-serving-ca.crt"))
	require.NoError(b, err)
	roots := x509.NewCertPool()
	require.True(b, roots.AppendCertsFromPEM(caPEM))
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12,
	}}}
}

// liveHeap asks cluster's mci-apiserver for its live heap (HeapAlloc) right
// after a garbage collection: pprof's heap profile with gc=1 collects first
// and reports runtime.MemStats. It asks twice and reports the second: a
// sync.Pool keeps what it holds over one collection (the compact codec's
// compressors and decompressors, 40 KiB to 1 MiB each, as many as
// decoded at once), which is no live object; the second collection frees
// it.
func (e *env) liveHeap(b *testing.B, cluster string) uint64 {
	b.Helper()
	e.heapAlloc(b, cluster)
	return e.heapAlloc(b, cluster)
}

// heapAlloc is HeapAlloc of cluster's mci-apiserver after one collection.
func (e *env) heapAlloc(b *testing.B, cluster string) uint64 {
	b.Helper()
	c, err := e.cs.Cluster(cluster)
	require.NoError(b, err)
	resp, err := e.mciHTTP(b).Get(fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/heap?gc=1&debug=1", c.MCIAPIServerReplicaPorts[0]))
	require.NoError(b, err)
	defer resp.Body.Close()
	require.Equal(b, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatal("no HeapAlloc in the heap profile")
	return 0
}

// saveHeapProfile writes cluster's mci-apiserver heap profile (after a
// garbage collection) to name in the output directory, for
// `go tool pprof -sample_index=inuse_space`: what the figures of the memory
// section are made of.
func (e *env) saveHeapProfile(b *testing.B, cluster, name string) {
	b.Helper()
	if cfg.Out == "" {
		return
	}
	c, err := e.cs.Cluster(cluster)
	require.NoError(b, err)
	resp, err := e.mciHTTP(b).Get(fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/heap?gc=1", c.MCIAPIServerReplicaPorts[0]))
	require.NoError(b, err)
	defer resp.Body.Close()
	require.Equal(b, http.StatusOK, resp.StatusCode)
	data, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	require.NoError(b, os.MkdirAll(cfg.Out, 0o755))
	require.NoError(b, os.WriteFile(filepath.Join(cfg.Out, name), data, 0o644))
	logf("heap profile of %s's mci-apiserver: %s", cluster, filepath.Join(cfg.Out, name))
}

// saveCPUProfile starts a CPU profile of cluster's mci-apiserver over the
// next d (pprof's /debug/pprof/profile) and returns a function that waits
// for it and writes it to name in the output directory, for
// `go tool pprof -top`. A profile that cannot be taken is logged, not
// fatal: it explains a figure, it is not one.
func (e *env) saveCPUProfile(b *testing.B, cluster, name string, d time.Duration) (wait func()) {
	b.Helper()
	if cfg.Out == "" {
		return func() {}
	}
	c, err := e.cs.Cluster(cluster)
	require.NoError(b, err)
	url := fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/profile?seconds=%d", c.MCIAPIServerReplicaPorts[0], int(max(d, time.Second)/time.Second))
	client := e.mciHTTP(b)
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", url, resp.Status)
			}
			data, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(cfg.Out, name), data, 0o644)
		}()
	}()
	return func() {
		if err := <-done; err != nil {
			logf("no CPU profile of %s's mci-apiserver: %v", cluster, err)
			return
		}
		logf("CPU profile of %s's mci-apiserver: %s", cluster, filepath.Join(cfg.Out, name))
	}
}

// stableHeap samples the heap until two samples apart agree within 1 MiB
// (or 2%): the server's informers have caught up.
func (e *env) stableHeap(b *testing.B, cluster string) uint64 {
	b.Helper()
	interval := 2 * time.Second
	if cfg.Profile == "smoke" {
		interval = 300 * time.Millisecond
	}
	prev := e.liveHeap(b, cluster)
	for range 20 {
		time.Sleep(interval) // two samples apart: stability is measured over it
		cur := e.liveHeap(b, cluster)
		diff := int64(cur) - int64(prev)
		if diff < 0 {
			diff = -diff
		}
		if diff < 1<<20 || float64(diff) < 0.02*float64(cur) {
			return cur
		}
		prev = cur
	}
	return prev
}

// rss is the resident set of cluster's mci-apiserver, from /proc.
func (e *env) rss(b *testing.B, cluster string) uint64 {
	b.Helper()
	return procRSS(b, e.mciPID(b, cluster))
}

// cpuTime is the CPU time cluster's mci-apiserver has used so far, from
// /proc.
func (e *env) cpuTime(b *testing.B, cluster string) time.Duration {
	b.Helper()
	return processCPU(b, e.mciPID(b, cluster))
}

// mciPID is the process id of cluster's mci-apiserver.
func (e *env) mciPID(b *testing.B, cluster string) int {
	b.Helper()
	return e.pid(b, cluster+"-mci-apiserver")
}

// kubePID is the process id of cluster's kube-apiserver.
func (e *env) kubePID(b *testing.B, cluster string) int {
	b.Helper()
	return e.pid(b, cluster+"-kube-apiserver")
}

// pid is the process id of the ClusterSet's server named name.
func (e *env) pid(b *testing.B, name string) int {
	b.Helper()
	for _, p := range e.cs.Processes() {
		if p.Name == name {
			return p.PID
		}
	}
	b.Fatalf("no process %s in the ClusterSet", name)
	return 0
}

// procRSS is the resident set of process pid, from /proc.
func procRSS(b *testing.B, pid int) uint64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(b, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(b, err)
			return kb << 10
		}
	}
	b.Fatalf("no VmRSS for process %d", pid)
	return 0
}

// etcdBytes is the size of the keys and values under prefix in the
// ClusterSet's etcd, read through etcd's JSON gateway (/v3/kv/range).
func (e *env) etcdBytes(b *testing.B, prefix string) (keys int, size int64) {
	b.Helper()
	var port int
	for _, p := range e.cs.Processes() {
		if p.Name == "etcd" {
			port = p.Port
		}
	}
	require.NotZero(b, port, "no etcd in the ClusterSet")
	end := []byte(prefix)
	end[len(end)-1]++
	body, _ := json.Marshal(map[string]any{
		"key":       base64.StdEncoding.EncodeToString([]byte(prefix)),
		"range_end": base64.StdEncoding.EncodeToString(end),
	})
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Post("http://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(port))+"/v3/kv/range", "application/json", bytes.NewReader(body))
	require.NoError(b, err)
	defer resp.Body.Close()
	require.Equal(b, http.StatusOK, resp.StatusCode)
	var out struct {
		KVs []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"kvs"`
	}
	require.NoError(b, json.NewDecoder(resp.Body).Decode(&out))
	for _, kv := range out.KVs {
		size += int64(base64.StdEncoding.DecodedLen(len(kv.Key)) + base64.StdEncoding.DecodedLen(len(kv.Value)))
	}
	return len(out.KVs), size
}
