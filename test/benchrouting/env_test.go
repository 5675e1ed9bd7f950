package benchrouting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/simulator"
)

// The clusters that serve the pool: cluster-b imports and runs mci-sidecar
// and the gateway, with a local pool of its own; cluster-a and cluster-c
// export theirs. The ClusterSet has one more, secondImporterCluster, that
// only imports.
var clusterNames = []string{"cluster-a", "cluster-b", "cluster-c"}

// allClusters are the ClusterSet's clusters, in the order of their
// loopback blocks.
var allClusters = append(slices.Clone(clusterNames), secondImporterCluster)

// exportingClusters are the clusters that export the pool.
var exportingClusters = slices.DeleteFunc(slices.Clone(clusterNames), func(c string) bool { return c == importingCluster })

const (
	importingCluster = "cluster-b"
	// saturatedCluster is the remote cluster that background load fills
	// in the saturated-cluster scenario.
	saturatedCluster = "cluster-a"
	// policyAnnotation selects mci-sidecar's cluster policy on the
	// HTTPRoute (pkg/routetable's PolicyAnnotation, which this harness
	// deliberately does not import: it drives the sidecar as a user does).
	policyAnnotation = "mci.x-k8s.io/cluster-policy"
	// directGatewayHost is the host, in each cluster's loopback block, of
	// the harness's own gateway to that cluster's EPP.
	directGatewayHost = 150
)

var (
	httpRouteGVR     = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
	inferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	podGVR           = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	importGVR        = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha1", Resource: "inferencepoolimports"}
)

// env is the running ClusterSet and data path.
type env struct {
	cfg config
	cs  *localclusterset.ClusterSet
	dyn dynamic.Interface // of the importing cluster
	// dir holds the ClusterSet, the data path's binaries (bin) and the
	// logs of the harness's own processes.
	dir string

	// The data path of the current workload (startDataPath): dp, its shape,
	// the servers' base URLs by cluster, and direct the base URLs of the
	// harness's gateways to each cluster's EPP.
	dp      *localclusterset.DataPath
	shape   serverShape
	servers map[string][]string
	direct  map[string]string
	// closeDirect stops the direct gateways.
	closeDirect []func()
	policy      string // the current cluster policy; "" before the first
	// importer2 is the gateway of the second importer's mci-sidecar
	// (secondImporter), "" until a workload needs it; importer2Dyn is
	// its cluster's client.
	importer2    string
	importer2Dyn dynamic.Interface
}

// serverShape is what the data path's simulators are started with: a
// workload's data path starts with its own.
type serverShape struct {
	servers, batch int
	far            string
}

// startEnv starts the ClusterSet (allClusters) until the benchmark ends; the
// data path starts with each workload (startDataPath).
func startEnv(b *testing.B, cfg config) *env {
	b.Helper()
	binDir, err := localclusterset.BinDir()
	require.NoError(b, err)
	// The data path's test doubles are built next to the ClusterSet.
	dir, err := os.MkdirTemp("", "mci-bench-routing-")
	require.NoError(b, err)
	b.Cleanup(func() {
		if os.Getenv("MCI_BENCH_KEEP") == "" {
			_ = os.RemoveAll(dir)
		} else {
			b.Logf("ClusterSet kept in %s", dir)
		}
	})
	dpBin := filepath.Join(dir, "bin")
	require.NoError(b, os.MkdirAll(dpBin, 0o755))
	for _, name := range []string{"mci-epp", "mci-sidecar"} {
		require.NoError(b, os.Symlink(filepath.Join(binDir, name), filepath.Join(dpBin, name)))
	}
	buildDoubles(b, dpBin)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{
		Dir:                filepath.Join(dir, "clusterset"),
		Clusters:           allClusters,
		BinDir:             binDir,
		MCIAPIServerBinary: filepath.Join(binDir, "mci-apiserver"),
		Log:                progressLog{},
	})
	require.NoError(b, err, "starting the local ClusterSet")
	b.Cleanup(func() {
		if err := cs.Stop(); err != nil {
			b.Errorf("stopping the ClusterSet: %v", err)
		}
	})
	logf("ClusterSet up in %s", time.Since(start).Round(time.Second))
	c, err := cs.Cluster(importingCluster)
	require.NoError(b, err)
	dyn, err := dynamic.NewForConfig(c.Config)
	require.NoError(b, err)
	e := &env{cfg: cfg, cs: cs, dyn: dyn, dir: dir}
	b.Cleanup(e.stopDirect)
	return e
}

// startDataPath starts the data path for w: its simulators with w's
// servers (batch places and round trips are flags), mci-sidecar and the
// EPPs, all with empty state, as at the first start. Every workload
// starts one of its own, so that it is measured as it would be alone: a
// sidecar remembers the homes of the groups it served for minutes, and
// dealt a workload's groups among those of the workload before it, which
// no longer send (2026-12-07: after held-out-9109's 43 groups, direct-30's
// 6 left cluster-a 12 points below an equal share in every repetition,
// 0.6 points off alone).
func (e *env) startDataPath(ctx context.Context, w spec) error {
	shape := serverShape{servers: w.ServersPerCluster, batch: w.Batch, far: w.Far}
	e.stopDirect()
	e.importer2 = ""
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if e.dp != nil && shape.servers < e.shape.servers {
		if err := e.deleteServerPods(ctx, shape.servers+1, e.shape.servers); err != nil {
			return err
		}
	}
	start := time.Now()
	dp, err := e.cs.StartDataPath(ctx, localclusterset.DataPathOptions{
		GatewayCluster:    importingCluster,
		ExportingClusters: exportingClusters,
		ModelServers:      shape.servers,
		LoopbackBlock:     e.cfg.LoopbackBlock,
		BinDir:            e.binDir(),
		LocalPool:         true,
		SimulatorArgs:     func(cluster string) []string { return simulatorArgs(e.cfg, shape, cluster) },
		// The simulators' batch places, which no model server publishes
		// as a metric: mci-epp publishes them with its pool gauges.
		EPPArgs: []string{"--model-server-max-num-seqs=" + strconv.Itoa(shape.batch)},
	})
	if err != nil {
		return fmt.Errorf("starting the data path: %w", err)
	}
	e.dp, e.shape, e.servers, e.direct, e.policy = dp, shape, dp.ModelServerURLs, map[string]string{}, ""
	for i, cluster := range clusterNames {
		if len(e.servers[cluster]) != shape.servers {
			return fmt.Errorf("%s has %d model servers, want %d", cluster, len(e.servers[cluster]), shape.servers)
		}
		base, stop, err := startDirectGateway(dp.EPPs[cluster], fmt.Sprintf("127.0.%d.%d", e.cfg.LoopbackBlock+i, directGatewayHost))
		if err != nil {
			return err
		}
		e.direct[cluster] = base
		e.closeDirect = append(e.closeDirect, stop)
	}
	logf("data path up in %s: %d servers per cluster, %d batch places each, far cluster %q", time.Since(start).Round(time.Second), shape.servers, shape.batch, shape.far)
	return nil
}

// deleteServerPods deletes the Pods of model servers from to to (as the
// data path names them) in every cluster: the data path applies the Pods
// of the servers it starts and leaves others, which the EPPs would keep
// picking once their simulators are gone.
func (e *env) deleteServerPods(ctx context.Context, from, to int) error {
	zero := int64(0)
	for _, cluster := range clusterNames {
		c, err := e.cs.Cluster(cluster)
		if err != nil {
			return err
		}
		dyn, err := dynamic.NewForConfig(c.Config)
		if err != nil {
			return err
		}
		for n := from; n <= to; n++ {
			name := fmt.Sprintf("model-server-%d", n)
			err := dyn.Resource(podGVR).Namespace(localclusterset.DataPathNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting the Pod %s of %s: %w", name, cluster, err)
			}
		}
	}
	return nil
}

func (e *env) binDir() string { return filepath.Join(e.dir, "bin") }

func (e *env) stopDirect() {
	for _, stop := range e.closeDirect {
		stop()
	}
	e.closeDirect = nil
}

// buildDoubles builds the data path's test doubles (the simulator and the
// gateway) into dir.
func buildDoubles(b *testing.B, dir string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "github.com/mci-dev/mci/test/cmd/simulator", "github.com/mci-dev/mci/test/cmd/gateway").CombinedOutput()
	require.NoError(b, err, "building the simulator and the gateway: %s", out)
}

// simulatorArgs are the cost model's flags for cluster's simulators: the
// remote clusters' add the round trip, the far one more.
func simulatorArgs(cfg config, shape serverShape, cluster string) []string {
	cm := cfg.Cost
	args := []string{
		"--concurrency=" + strconv.Itoa(shape.batch),
		"--block-tokens=" + strconv.Itoa(cm.BlockTokens),
		"--cache-blocks=" + strconv.Itoa(cm.CacheBlocks),
		"--prefill-base=" + cm.Base.String(),
		"--prefill-per-token=" + cm.PrefillPerToken.String(),
		"--decode-per-token=" + cm.DecodePerToken.String(),
		"--output-tokens=" + strconv.Itoa(cm.OutputTokens),
		"--stream-chunk-tokens=" + strconv.Itoa(cm.StreamChunkTokens),
	}
	switch {
	case cluster == shape.far:
		args = append(args, "--round-trip="+(cfg.RemoteRoundTrip+cfg.FarRoundTrip).String())
	case cluster != importingCluster:
		args = append(args, "--round-trip="+cfg.RemoteRoundTrip.String())
	}
	return args
}

// startDirectGateway serves, on ip, a gateway (test/envoyclient's Proxy, the
// code of test/cmd/gateway) that asks the EPP at epp: the path of the
// reference routings, which choose the cluster themselves and leave the
// choice of the server to that cluster's EPP.
func startDirectGateway(epp, ip string) (string, func(), error) {
	client, err := envoyclient.Dial(epp, envoyclient.Options{MessageTimeout: 10 * time.Second})
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		_ = client.Close()
		return "", nil, err
	}
	srv := &http.Server{Handler: envoyclient.NewProxy(client, nil), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), func() {
		_ = srv.Close()
		_ = client.Close()
	}, nil
}

// setPolicy sets the cluster policy on the HTTPRoute and on the local
// shim InferencePool, and on the second importer's HTTPRoute when it runs,
// and waits until the mci-sidecar that reads each has rebuilt its routing
// table after its change (the policy is part of the table). The route's
// annotation decides for the requests its rule matches (pkg/routetable's
// Table.ShimFor); the pool's, for any other request to the pool, so that
// no request of a run escapes the policy.
func (e *env) setPolicy(ctx context.Context, policy string) error {
	if policy == e.policy {
		return nil
	}
	for _, o := range e.policyObjects() {
		if err := e.annotatePolicy(ctx, o, policy); err != nil {
			return err
		}
	}
	e.policy = policy
	return nil
}

// policyObject is an object that carries the cluster policy: its
// resource, through its cluster's client, and the gateway of the
// mci-sidecar that reads it.
type policyObject struct {
	dyn     dynamic.Interface
	gvr     schema.GroupVersionResource
	gateway string
}

func (e *env) policyObjects() []policyObject {
	out := []policyObject{{e.dyn, httpRouteGVR, e.dp.GatewayURL}, {e.dyn, inferencePoolGVR, e.dp.GatewayURL}}
	if e.importer2 != "" {
		out = append(out, policyObject{e.importer2Dyn, httpRouteGVR, e.importer2})
	}
	return out
}

// annotatePolicy sets policy on o, and waits until its mci-sidecar has
// rebuilt its routing table after the change. A restarted data path keeps
// the objects' annotations, which its new sidecar read as it started:
// setting the same value again changes nothing and rebuilds nothing.
func (e *env) annotatePolicy(ctx context.Context, o policyObject, policy string) error {
	res := o.dyn.Resource(o.gvr).Namespace(e.dp.Namespace)
	obj, err := res.Get(ctx, e.dp.Pool, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading %s %s/%s: %w", o.gvr.Resource, e.dp.Namespace, e.dp.Pool, err)
	}
	if obj.GetAnnotations()[policyAnnotation] == policy {
		return nil
	}
	u, err := url.Parse(o.gateway)
	if err != nil {
		return err
	}
	before, err := sidecarGeneration(ctx, u.Hostname())
	if err != nil {
		return err
	}
	if err := patchPolicy(ctx, res, e.dp.Pool, policy); err != nil {
		return fmt.Errorf("setting the cluster policy %s on %s %s/%s: %w", policy, o.gvr.Resource, e.dp.Namespace, e.dp.Pool, err)
	}
	last := before
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		last, err = sidecarGeneration(ctx, u.Hostname())
		return err == nil && last > before, nil
	})
	if err != nil {
		return fmt.Errorf("the mci-sidecar of %s did not rebuild its routing table after the cluster policy %s was set on %s (generation %v, was %v): %w", o.gateway, policy, o.gvr.Resource, last, before, err)
	}
	return nil
}

// patchPolicy sets the policy annotation on the object name of res.
func patchPolicy(ctx context.Context, res dynamic.ResourceInterface, name, policy string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{policyAnnotation: policy}}})
	_, err := res.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// tableGeneration reads the data path's mci-sidecar's
// mci_sidecar_routing_table_generation.
func (e *env) tableGeneration(ctx context.Context) (float64, error) {
	u, err := url.Parse(e.dp.GatewayURL)
	if err != nil {
		return 0, err
	}
	return sidecarGeneration(ctx, u.Hostname())
}

// sidecarGeneration reads mci_sidecar_routing_table_generation of the
// mci-sidecar on host.
func sidecarGeneration(ctx context.Context, host string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// mci-sidecar shares the gateway's pod: its metrics are on 9090.
	m, err := promtext.Get(ctx, "http://"+net.JoinHostPort(host, "9090")+"/metrics")
	if err != nil {
		return 0, fmt.Errorf("reading mci-sidecar's metrics: %w", err)
	}
	v, found, err := m.Lookup("mci_sidecar_routing_table_generation")
	if err == nil && !found {
		err = errors.New("mci-sidecar has no mci_sidecar_routing_table_generation")
	}
	return v, err
}

// summaryFigures are what the EPPs of the data path report of their
// prefix summaries: the bytes sent so far, over all of them, the largest
// summary last built, and how many EPPs (pools) there are.
type summaryFigures struct {
	sent, largest float64
	pools         int
}

// prefixSummaries reads mci_epp_prefix_summary_sent_bytes_total and
// mci_epp_prefix_summary_bytes of every cluster's mci-epp (its metrics on
// 9090 of its ext_proc address).
func (e *env) prefixSummaries(ctx context.Context) (summaryFigures, error) {
	var f summaryFigures
	for cluster, addr := range e.dp.EPPs {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return f, err
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := promtext.Get(ctx, "http://"+net.JoinHostPort(host, "9090")+"/metrics")
		cancel()
		if err != nil {
			return f, fmt.Errorf("reading %s's mci-epp metrics: %w", cluster, err)
		}
		f.sent += m.Sum("mci_epp_prefix_summary_sent_bytes_total", nil)
		f.largest = max(f.largest, m.Sum("mci_epp_prefix_summary_bytes", nil))
		f.pools++
	}
	return f, nil
}

// homeDecisions sums mci_sidecar_prefix_home_requests_total by result over
// the mci-sidecars on hosts: the lead decisions of home placement.
func homeDecisions(ctx context.Context, hosts []string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, host := range hosts {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := promtext.Get(ctx, "http://"+net.JoinHostPort(host, "9090")+"/metrics")
		cancel()
		if err != nil {
			return nil, fmt.Errorf("reading mci-sidecar's metrics: %w", err)
		}
		for _, result := range homeResults {
			out[result] += m.Sum("mci_sidecar_prefix_home_requests_total", map[string]string{"result": result})
		}
	}
	return out, nil
}

// homeResults are the results of mci_sidecar_prefix_home_requests_total:
// the outcomes of home placement's lead decision.
var homeResults = func() []string {
	var out []string
	for _, o := range clusterscore.HomeOutcomes() {
		out = append(out, o.String())
	}
	return out
}()

// allServers lists every model server as cluster and URL.
func (e *env) allServers() []server {
	var out []server
	for _, c := range clusterNames {
		for _, u := range e.servers[c] {
			out = append(out, server{cluster: c, url: u})
		}
	}
	return out
}

type server struct{ cluster, url string }

// resetCaches empties every server's prefix cache, so that each run
// starts cold, and waits until no request runs or waits anywhere.
func (e *env) resetCaches(ctx context.Context) error {
	for _, s := range e.allServers() {
		var st simulator.CacheStats
		if err := call(ctx, http.MethodDelete, s.url+"/admin/cache", nil, &st); err != nil {
			return err
		}
	}
	busy := ""
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, e.cfg.RequestTimeout+10*time.Second, true, func(ctx context.Context) (bool, error) {
		busy = ""
		for _, s := range e.allServers() {
			var m simulator.Metrics
			if err := call(ctx, http.MethodGet, s.url+"/admin/load", nil, &m); err != nil {
				return false, err
			}
			if m.Running+m.Waiting > 0 {
				busy = fmt.Sprintf("%s has %d running and %d waiting", s.url, m.Running, m.Waiting)
			}
		}
		return busy == "", nil
	})
	if err != nil && busy != "" {
		return fmt.Errorf("the servers did not drain: %s", busy)
	}
	return err
}

// cacheStats reads every server's prefix cache counters, by URL.
func (e *env) cacheStats(ctx context.Context) (map[string]simulator.CacheStats, error) {
	out := map[string]simulator.CacheStats{}
	for _, s := range e.allServers() {
		var st simulator.CacheStats
		if err := call(ctx, http.MethodGet, s.url+"/admin/cache", nil, &st); err != nil {
			return nil, err
		}
		out[s.url] = st
	}
	return out, nil
}

// call sends a request with an optional JSON body and decodes the JSON
// answer into into.
func call(ctx context.Context, method, url string, body []byte, into any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var r io.Reader
	if body != nil {
		r = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	return nil
}

// loopbackTransport reaches the data path directly, whatever the
// environment's proxy settings, with enough idle connections for the
// open-loop load.
func loopbackTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	return tr
}

var adminClient = &http.Client{Transport: loopbackTransport()}

// progressLog prints the ClusterSet's progress lines with the benchmark's.
type progressLog struct{}

func (progressLog) Write(p []byte) (int, error) {
	logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-routing %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
