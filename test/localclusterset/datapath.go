package localclusterset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The data path of `make run`: in each exporting cluster, model-server
// simulators (test/cmd/simulator) behind a real mci-epp in Kubernetes mode,
// with the pool exported in EndpointMode and its EPP Service's LoadBalancer
// address set to the EPP's loopback address; in the gateway cluster,
// mci-sidecar and an Envoy-like gateway (test/cmd/gateway) that speaks
// ext_proc to it and proxies to the destination it names, routing an
// HTTPRoute to the pool's InferencePoolImport. A request to the gateway
// then lands on a model server of another cluster, through the same
// processes and objects as in a real ClusterSet.
//
// Every "pod" has a loopback address of its own, so each uses the standard
// ports: the i-th cluster of the ClusterSet gets 127.0.<block+i>.0/24,
// model server n on .n:8000, the EPP on .100:9002/9003/9090, and in the
// gateway cluster the gateway pod on .1 (gateway 8080, mci-sidecar
// 9002/9003/9090, as Envoy and the sidecar share a pod).

const (
	// DefaultDataPathLoopbackBlock is the first loopback block of the data
	// path; e2e tests use 127.0.71-83.x.
	DefaultDataPathLoopbackBlock = 90
	// DataPathNamespace holds the data path's objects in every cluster.
	DataPathNamespace = "demo"
	// DataPathPool is the exported InferencePool, and its import.
	DataPathPool = "llm-pool"
	// DataPathModel is the base model the simulators serve.
	DataPathModel = "meta-llama/Llama-3.1-8B-Instruct"
	// DataPathGatewayPort is where the gateway serves HTTP.
	DataPathGatewayPort = 8080
	// DataPathGatewayName is the Gateway the data path's mci-sidecar
	// serves, in DataPathNamespace.
	DataPathGatewayName = "inference-gateway"

	modelServerPort = 8000
	eppGRPCPort     = 9002
	eppHealthPort   = 9003
	eppMetricsPort  = 9090
	eppHost         = 100
	// eppLinkedHost is where the EPP listens when a link takes its
	// Service address (Options.Links).
	eppLinkedHost   = 101
	dataPathTimeout = 90 * time.Second
	// simulatorInstanceHeader is test/simulator's InstanceHeader, which
	// this package cannot import: pkg/discovery's tests import this
	// package, and test/simulator imports pkg/discovery.
	simulatorInstanceHeader = "X-Simulator-Instance"
)

// DataPathOptions say where the data path runs.
type DataPathOptions struct {
	// GatewayCluster runs mci-sidecar and the gateway; "cluster-b" when
	// empty.
	GatewayCluster string
	// ExportingClusters run model servers and an EPP and export the pool;
	// every other cluster when empty.
	ExportingClusters []string
	// ModelServers is the number of simulators per exporting cluster; 2
	// when 0.
	ModelServers int
	// LoopbackBlock is the third octet of the first cluster's loopback
	// block; DefaultDataPathLoopbackBlock when 0.
	LoopbackBlock int
	// BinDir holds mci-epp, mci-sidecar, simulator and gateway; the
	// ClusterSet's BinDir when empty.
	BinDir string
	// Log receives progress lines; the ClusterSet's log when nil.
	Log io.Writer
	// LocalPool gives the gateway cluster model servers and an EPP of its
	// own too, behind a local shim InferencePool of the pool's name (its
	// endpointPickerRef is mci-sidecar's Service, which runs with
	// --endpoint-picker-service), and routes the HTTPRoute to that pool:
	// the sidecar then picks among the local cluster and the import's.
	LocalPool bool
	// SimulatorArgs, when set, returns more flags for the simulators of
	// cluster (for example a cost model).
	SimulatorArgs func(cluster string) []string
	// EPPArgs are more flags for every cluster's mci-epp (for example the
	// model servers' batch places).
	EPPArgs []string
}

// dataPathSidecarService is the Service name of mci-sidecar that a
// LocalPool's shim pool names as its endpointPickerRef.
const dataPathSidecarService = "mci-sidecar"

// DataPath is a running data path.
type DataPath struct {
	Namespace      string
	Pool           string
	Model          string
	GatewayCluster string
	// GatewayURL is the gateway's base URL, http://127.0.<block>.1:8080.
	GatewayURL string
	// ModelServers are the simulators' instance IDs
	// ("<cluster>/<pod>"), by cluster (the exporting ones, and the
	// gateway's with LocalPool).
	ModelServers map[string][]string
	// ModelServerURLs are the simulators' base URLs, in the order of
	// ModelServers.
	ModelServerURLs map[string][]string
	// EPPs are the ext_proc addresses of the clusters' mci-epp.
	EPPs map[string]string
}

// CompletionURL is where completion requests go through the gateway.
func (d *DataPath) CompletionURL() string { return d.GatewayURL + "/v1/completions" }

// CompletionBody is a completion request for the simulators' model.
func (d *DataPath) CompletionBody() string {
	b, _ := json.Marshal(map[string]any{"model": d.Model, "prompt": "Say hello", "max_tokens": 16})
	return string(b)
}

func (o *DataPathOptions) complete(cs *ClusterSet, gateway bool) error {
	if o.GatewayCluster == "" {
		o.GatewayCluster = "cluster-b"
	}
	if _, err := cs.Cluster(o.GatewayCluster); err != nil {
		return fmt.Errorf("data path gateway: %w", err)
	}
	if len(o.ExportingClusters) == 0 {
		for _, name := range cs.Names() {
			if name != o.GatewayCluster {
				o.ExportingClusters = append(o.ExportingClusters, name)
			}
		}
	}
	if len(o.ExportingClusters) == 0 {
		return errors.New("clusterset: the data path needs a cluster besides the gateway's to export a pool")
	}
	for _, name := range o.ExportingClusters {
		if _, err := cs.Cluster(name); err != nil {
			return fmt.Errorf("data path: %w", err)
		}
		if name == o.GatewayCluster {
			return fmt.Errorf("clusterset: %s cannot both export the pool and run the data path's gateway", name)
		}
	}
	if o.ModelServers == 0 {
		o.ModelServers = 2
	}
	if o.ModelServers < 0 || o.ModelServers >= eppHost {
		return fmt.Errorf("clusterset: %d model servers per cluster: want 1 to %d", o.ModelServers, eppHost-1)
	}
	if o.LoopbackBlock == 0 {
		o.LoopbackBlock = DefaultDataPathLoopbackBlock
	}
	if last := o.LoopbackBlock + len(cs.Clusters) - 1; o.LoopbackBlock < 1 || last > 255 {
		return fmt.Errorf("clusterset: loopback block %d: the data path of %d clusters needs 127.0.%d-%d.x", o.LoopbackBlock, len(cs.Clusters), o.LoopbackBlock, last)
	}
	if o.BinDir == "" {
		o.BinDir = cs.binDir
	}
	for _, b := range []string{"mci-epp", "mci-sidecar", "simulator", "gateway"} {
		if err := executable(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("clusterset: %w; build it with `go build -o %s/ ./cmd/mci-epp ./cmd/mci-sidecar ./test/cmd/simulator ./test/cmd/gateway`", err, o.BinDir)
		}
	}
	if gateway && cs.mciBinary == "" {
		return errors.New("clusterset: the data path needs mci-apiserver: the gateway routes to an InferencePoolImport")
	}
	return nil
}

// ip is the loopback address of host in cluster's block.
func (o *DataPathOptions) ip(cs *ClusterSet, cluster string, host int) string {
	return fmt.Sprintf("127.0.%d.%d", o.LoopbackBlock+slices.Index(cs.Names(), cluster), host)
}

// StartDataPath starts the data path (stopping one that runs already) and
// returns once a request sent to the gateway is answered by a model
// server. Its servers are recorded with the ClusterSet's: Stop and Down
// stop them, and StopDataPath alone.
func (cs *ClusterSet) StartDataPath(ctx context.Context, opts DataPathOptions) (*DataPath, error) {
	if err := opts.complete(cs, true); err != nil {
		return nil, err
	}
	if opts.Log != nil {
		cs.log, cs.started = opts.Log, time.Now()
	}
	if err := cs.StopDataPath(); err != nil {
		return nil, err
	}
	dp := newDataPath(cs, opts)
	servingClusters := opts.ExportingClusters
	if opts.LocalPool {
		servingClusters = append([]string{opts.GatewayCluster}, servingClusters...)
	}
	wait, err := cs.startServingClusters(ctx, opts, dp, servingClusters)
	if err != nil {
		return nil, err
	}
	bin := func(name string) string { return filepath.Join(opts.BinDir, name) }

	gwIP := opts.ip(cs, opts.GatewayCluster, 1)
	if err := cs.applyTemplate(ctx, opts.GatewayCluster, gatewayClusterTemplate, map[string]any{
		"Namespace": DataPathNamespace, "Pool": DataPathPool, "Gateway": DataPathGatewayName, "IP": gwIP, "Port": DataPathGatewayPort,
		"LocalPool": opts.LocalPool,
	}); err != nil {
		return nil, err
	}
	gc, _ := cs.Cluster(opts.GatewayCluster)
	sidecarAddr := net.JoinHostPort(gwIP, strconv.Itoa(eppGRPCPort))
	scArgs := []string{"--kubeconfig=" + gc.Kubeconfig, "--bind-address=" + gwIP, "--local-cluster-name=" + opts.GatewayCluster,
		"--gateway=" + DataPathNamespace + "/" + DataPathGatewayName, "-v=2",
		// Scraped freely here (the soak, a person with curl), as mci-epp's.
		"--metrics-endpoint-auth=false",
		// The local ClusterSet's EPPs serve plaintext on loopback.
		"--insecure-remote-endpoint-pickers=*",
		// Every pod of a ClusterSet on one machine has a loopback address:
		// the one place remote EPPs may name loopback destinations (the
		// sidecar logs it, and its metrics show it).
		"--allow-loopback-destinations"}
	if opts.LocalPool {
		scArgs = append(scArgs, "--endpoint-picker-service="+DataPathNamespace+"/"+dataPathSidecarService)
	}
	sc := cs.dataPathProcess(opts.GatewayCluster+"-mci-sidecar", bin("mci-sidecar"), eppGRPCPort, scArgs...)
	cs.progress("starting %s on %s", sc.Name, sidecarAddr)
	if err := cs.startDataPathProcess(sc); err != nil {
		return nil, err
	}
	wait = append(wait, awaited{sc, grpcServing(net.JoinHostPort(gwIP, strconv.Itoa(eppHealthPort)))})
	gw := cs.dataPathProcess(opts.GatewayCluster+"-gateway", bin("gateway"), DataPathGatewayPort,
		"--listen="+net.JoinHostPort(gwIP, strconv.Itoa(DataPathGatewayPort)), "--ext-proc="+sidecarAddr)
	cs.progress("starting %s (Envoy-like, ext_proc to mci-sidecar) on %s", gw.Name, dp.GatewayURL)
	if err := cs.startDataPathProcess(gw); err != nil {
		return nil, err
	}

	for _, w := range wait {
		if err := waitReady(ctx, w.p, dataPathTimeout, w.check); err != nil {
			return nil, err
		}
	}
	cs.progress("waiting for %s's InferencePoolImport %s/%s to list %s Ready", opts.GatewayCluster, DataPathNamespace, DataPathPool, strings.Join(opts.ExportingClusters, ", "))
	_, dyn, err := clients(gc.Config)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, nil, dataPathTimeout, importReady(dyn, DataPathNamespace, DataPathPool, opts.ExportingClusters)); err != nil {
		return nil, fmt.Errorf("%s's InferencePoolImport %s/%s: %w", opts.GatewayCluster, DataPathNamespace, DataPathPool, err)
	}
	cs.progress("sending a completion request through %s", dp.GatewayURL)
	var answered string
	if err := waitReady(ctx, gw, dataPathTimeout, func(ctx context.Context) (bool, string) {
		code, instance, body, err := dp.Send(ctx)
		switch {
		case err != nil:
			return false, err.Error()
		case code != http.StatusOK:
			return false, fmt.Sprintf("HTTP %d: %s", code, body)
		}
		answered = instance
		return true, ""
	}); err != nil {
		return nil, fmt.Errorf("%w\n(logs of mci-sidecar and the EPPs are in %s)", err, filepath.Join(cs.Dir, "logs"))
	}
	cs.progress("data path up: %s answered through %s's gateway", answered, opts.GatewayCluster)
	return dp, nil
}

// ApplyImportingGateway applies, in cluster, the data path's Gateway
// programmed at ip and an HTTPRoute from /v1 to the pool's
// InferencePoolImport: what the gateway cluster has without LocalPool. An
// mci-sidecar of cluster started with --gateway=<DataPathNamespace>/
// <DataPathGatewayName> then routes the route's requests over the import's
// exporters (a pool of the same name in cluster joins them only under the
// LocalFirst policy, as for any route that names an import).
func (cs *ClusterSet) ApplyImportingGateway(ctx context.Context, cluster, ip string) error {
	if _, err := cs.Cluster(cluster); err != nil {
		return fmt.Errorf("importing gateway: %w", err)
	}
	return cs.applyTemplate(ctx, cluster, gatewayClusterTemplate, map[string]any{
		"Namespace": DataPathNamespace, "Pool": DataPathPool, "Gateway": DataPathGatewayName, "IP": ip, "Port": DataPathGatewayPort,
		"LocalPool": false,
	})
}

// awaited is a started server and the check that says it is ready.
type awaited struct {
	p     *process
	check func(context.Context) (bool, string)
}

func newDataPath(cs *ClusterSet, opts DataPathOptions) *DataPath {
	return &DataPath{
		Namespace:       DataPathNamespace,
		Pool:            DataPathPool,
		Model:           DataPathModel,
		GatewayCluster:  opts.GatewayCluster,
		GatewayURL:      "http://" + net.JoinHostPort(opts.ip(cs, opts.GatewayCluster, 1), strconv.Itoa(DataPathGatewayPort)),
		ModelServers:    map[string][]string{},
		ModelServerURLs: map[string][]string{},
		EPPs:            map[string]string{},
	}
}

// startServingClusters starts, in each of clusters, the model servers and
// mci-epp behind the pool, with the pool (exported, or a shim pool in the
// gateway cluster) and its EPP Service.
func (cs *ClusterSet) startServingClusters(ctx context.Context, opts DataPathOptions, dp *DataPath, clusters []string) ([]awaited, error) {
	bin := func(name string) string { return filepath.Join(opts.BinDir, name) }
	var wait []awaited
	for _, cluster := range clusters {
		var pods []dataPathPod
		for n := 1; n <= opts.ModelServers; n++ {
			pod := dataPathPod{Name: fmt.Sprintf("model-server-%d", n), IP: opts.ip(cs, cluster, n)}
			instance := cluster + "/" + pod.Name
			addr := net.JoinHostPort(pod.IP, strconv.Itoa(modelServerPort))
			args := []string{"--listen=" + addr, "--model=" + DataPathModel, "--instance-id=" + instance}
			if opts.SimulatorArgs != nil {
				args = append(args, opts.SimulatorArgs(cluster)...)
			}
			p := cs.dataPathProcess(cluster+"-"+pod.Name, bin("simulator"), modelServerPort, args...)
			cs.progress("starting %s (simulator) on %s", p.Name, addr)
			if err := cs.startDataPathProcess(p); err != nil {
				return nil, err
			}
			wait = append(wait, awaited{p, httpOK("http://" + addr + "/health")})
			pods = append(pods, pod)
			dp.ModelServers[cluster] = append(dp.ModelServers[cluster], instance)
			dp.ModelServerURLs[cluster] = append(dp.ModelServerURLs[cluster], "http://"+addr)
		}
		eppIP := opts.ip(cs, cluster, eppHost)
		dp.EPPs[cluster] = net.JoinHostPort(eppIP, strconv.Itoa(eppGRPCPort))
		shim := ""
		if cluster == opts.GatewayCluster {
			shim = dataPathSidecarService
		}
		if err := cs.applyTemplate(ctx, cluster, exportingClusterTemplate, map[string]any{
			"Namespace": DataPathNamespace, "Pool": DataPathPool, "Pods": pods, "EPPIP": eppIP, "Shim": shim,
			"ModelServerPort": modelServerPort, "GRPCPort": eppGRPCPort, "HealthPort": eppHealthPort, "MetricsPort": eppMetricsPort,
		}); err != nil {
			return nil, err
		}
		c, _ := cs.Cluster(cluster)
		// With links, the EPP listens on an address of its own and the
		// link on the Service's, which the sidecar dials.
		listenIP := eppIP
		if cs.links != nil {
			listenIP = opts.ip(cs, cluster, eppLinkedHost)
			if err := cs.startEPPLink(cluster, eppIP, listenIP, eppGRPCPort, eppHealthPort, eppMetricsPort); err != nil {
				return nil, err
			}
		}
		args := append([]string{"--pool-name=" + DataPathPool, "--pool-namespace=" + DataPathNamespace, "--kubeconfig=" + c.Kubeconfig,
			"--bind-address=" + listenIP, "--base-models=" + DataPathModel, "-v=2"}, opts.EPPArgs...)
		p := cs.dataPathProcess(cluster+"-mci-epp", bin("mci-epp"), eppGRPCPort, args...)
		cs.progress("starting %s for %s/%s on %s", p.Name, DataPathNamespace, DataPathPool, net.JoinHostPort(listenIP, strconv.Itoa(eppGRPCPort)))
		if err := cs.startDataPathProcess(p); err != nil {
			return nil, err
		}
		wait = append(wait, awaited{p, grpcServing(net.JoinHostPort(listenIP, strconv.Itoa(eppHealthPort)))})
	}
	return wait, nil
}

// StartExporters starts the exporting side of the data path alone, for a
// test that brings its own gateway and mci-apiservers (the chart's pods):
// in each of opts.ExportingClusters, model servers and mci-epp behind the
// pool demo/llm-pool, exported in EndpointMode with its EPP Service's
// LoadBalancer address set to the EPP's loopback address. It returns once
// they answer; opts.GatewayCluster only names the cluster that does not
// export. StopDataPath stops them.
func (cs *ClusterSet) StartExporters(ctx context.Context, opts DataPathOptions) (*DataPath, error) {
	if err := opts.complete(cs, false); err != nil {
		return nil, err
	}
	if opts.LocalPool {
		return nil, errors.New("clusterset: StartExporters runs no gateway cluster to hold a LocalPool")
	}
	if err := cs.StopDataPath(); err != nil {
		return nil, err
	}
	dp := newDataPath(cs, opts)
	wait, err := cs.startServingClusters(ctx, opts, dp, opts.ExportingClusters)
	if err != nil {
		return nil, err
	}
	for _, w := range wait {
		if err := waitReady(ctx, w.p, dataPathTimeout, w.check); err != nil {
			return nil, err
		}
	}
	return dp, nil
}

// Send sends one completion request through the gateway and returns the
// status, the instance ID of the simulator that answered (its
// X-Simulator-Instance header) and the body.
func (d *DataPath) Send(ctx context.Context) (code int, instance, body string, err error) {
	return d.SendTo(ctx, "")
}

// SendTo is Send with host as the request's host ("": the gateway's
// address), for a route of the gateway matched by its host name.
func (d *DataPath) SendTo(ctx context.Context, host string) (code int, instance, body string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.CompletionURL(), strings.NewReader(d.CompletionBody()))
	if err != nil {
		return 0, "", "", err
	}
	if host != "" {
		req.Host = host
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := loopbackClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(simulatorInstanceHeader), string(b), err
}

// StopDataPath stops the data path's servers, if any run.
func (cs *ClusterSet) StopDataPath() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.dataPath) == 0 {
		return nil
	}
	if err := (&state{DataPath: cs.dataPath}).stop(cs.Dir, false); err != nil {
		return err
	}
	cs.dataPath = nil
	return cs.saveState()
}
