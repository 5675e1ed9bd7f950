package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/noserver"
	"github.com/mci-dev/mci/test/localclusterset"
)

// config is the soak's run, from the environment.
type config struct {
	// Duration is SOAK_DURATION: the whole soak after the ClusterSet is up
	// (warm-up, faults, quiet tail). DefaultSmokeDuration when unset: the
	// smoke of make test; make soak sets 20m.
	Duration time.Duration
	// Seed is SOAK_SEED; drawn at random (and printed) when unset.
	Seed uint64
	// Rate is SOAK_RATE, requests per second through the gateway.
	Rate float64
	// Watchers is SOAK_WATCHERS, raw watches spread over the clusters.
	Watchers int
	// Out is SOAK_OUT, where results.md and results.json go.
	Out string
	// LoopbackBlock is the data path's first loopback block (127.0.231-233.x):
	// e2e's data paths use 90 and 71-83, 176-178 and others; bench-routing 221.
	LoopbackBlock int

	Warmup, Tail time.Duration
	// JudgeGrowth: runs of at least 10 minutes judge heap, goroutine and
	// descriptor growth; shorter ones only report it.
	JudgeGrowth bool
	// HealTarget is the p99 bound of the time from a heal to every view
	// equal to a fresh LIST: 2s for a soak, 5s for the smoke,
	// which shares a loaded 2-core CI machine (as e2e's healBound).
	HealTarget time.Duration
}

// DefaultSmokeDuration is the soak's length when SOAK_DURATION is unset.
const DefaultSmokeDuration = 75 * time.Second

// unreachableAfter is every mci-apiserver's --member-unreachable-after:
// as in e2e's link tests, longer than the 2s slow link so that a slow
// member is not flagged as down.
const unreachableAfter = 5 * time.Second

// sidecarLag is how long after the gateway cluster's import stops listing
// a cluster the sidecar may still route to it: its informer, through the
// aggregator, is a view like the soak's, whose target is 2s.
const sidecarLag = 2 * time.Second

// explainGrace is how long after a fault heals a failed request is still
// explained by it: the gateway's ext_proc message timeout (10s) and the
// sidecar's next EPP health probe.
const explainGrace = 15 * time.Second

func loadConfig() (config, error) {
	c := config{Duration: DefaultSmokeDuration, Rate: 10, Watchers: 50, LoopbackBlock: 231, Out: filepath.Join("..", "..", "_output", "soak")}
	var err error
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		if c.Duration, err = time.ParseDuration(v); err != nil {
			return c, fmt.Errorf("SOAK_DURATION: %w", err)
		}
		if c.Duration < 45*time.Second {
			return c, fmt.Errorf("SOAK_DURATION %s: at least 45s (warm-up, faults, tail)", c.Duration)
		}
	}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		if c.Seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			return c, fmt.Errorf("SOAK_SEED: %w", err)
		}
	} else {
		c.Seed = rand.Uint64() % 1_000_000
	}
	if v := os.Getenv("SOAK_RATE"); v != "" {
		if c.Rate, err = strconv.ParseFloat(v, 64); err != nil || c.Rate <= 0 || c.Rate > 50 {
			return c, fmt.Errorf("SOAK_RATE %q: a rate of requests per second in (0, 50]", v)
		}
	}
	if v := os.Getenv("SOAK_WATCHERS"); v != "" {
		if c.Watchers, err = strconv.Atoi(v); err != nil || c.Watchers < 0 {
			return c, fmt.Errorf("SOAK_WATCHERS %q: a count", v)
		}
	}
	if v := os.Getenv("SOAK_OUT"); v != "" {
		c.Out = v
	}
	c.Warmup = min(60*time.Second, max(10*time.Second, c.Duration/20))
	c.Tail = min(2*time.Minute, max(20*time.Second, c.Duration/10))
	c.JudgeGrowth = c.Duration >= 10*time.Minute
	c.HealTarget = 2 * time.Second
	if c.Duration < 10*time.Minute {
		c.HealTarget = 5 * time.Second
	}
	return c, nil
}

// TestSoak is the chaos soak: see the package comment.
func TestSoak(t *testing.T) {
	cfg, err := loadConfig()
	require.NoError(t, err)
	logw := &stampWriter{w: os.Stdout}
	logf := func(format string, args ...any) { fmt.Fprintf(logw, format+"\n", args...) }
	logf("soak: seed %d (SOAK_SEED=%d replays this schedule), duration %s, %.0f req/s, %d watchers", cfg.Seed, cfg.Seed, cfg.Duration, cfg.Rate, cfg.Watchers)

	binDir, err := localclusterset.BinDir()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "mci-soak-")
	require.NoError(t, err)
	ctx := t.Context()
	upCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(upCtx, localclusterset.Options{
		Dir:                    dir,
		BinDir:                 binDir,
		MCIAPIServerBinary:     filepath.Join(binDir, "mci-apiserver"),
		Clusters:               []string{"cluster-a", "cluster-b", "cluster-c"},
		Replicas:               2,
		MemberUnreachableAfter: unreachableAfter,
		Links:                  true,
		// Its lines carry their own time stamps.
		Log: os.Stdout,
	})
	require.NoError(t, err, "starting the ClusterSet")
	t.Cleanup(func() {
		if err := cs.Stop(); err != nil {
			t.Logf("stopping the ClusterSet: %v", err)
		}
		if t.Failed() {
			t.Logf("logs kept in %s", filepath.Join(dir, "logs"))
		} else {
			_ = os.RemoveAll(dir)
		}
	})
	dp, err := cs.StartDataPath(upCtx, localclusterset.DataPathOptions{GatewayCluster: "cluster-b", LoopbackBlock: cfg.LoopbackBlock})
	require.NoError(t, err, "starting the data path")
	exporters := []string{"cluster-a", "cluster-c"}
	topo := topology{Clusters: cs.Names(), Gateway: dp.GatewayCluster, Exporters: exporters, Rotating: [2]string{dp.GatewayCluster, exporters[0]}, Named: [2]string{exporters[len(exporters)-1], exporters[0]},
		Regional: exporters[0]}

	kube := map[string]kubernetes.Interface{}
	mci := map[string]mciclient.Interface{}
	w := newWorld(cs.Names())
	for _, c := range cs.Clusters {
		cfg := rest.CopyConfig(c.Config)
		cfg.QPS, cfg.Burst = 200, 400
		kube[c.Name] = kubernetes.NewForConfigOrDie(cfg)
		mci[c.Name] = mciclient.NewForConfigOrDie(cfg)
		require.NoError(t, createNamespace(ctx, kube[c.Name], soakNS))
		// Every cluster imports the recreated pool into a namespace of that name.
		require.NoError(t, createNamespace(ctx, kube[c.Name], recreatedNS))
	}
	for _, e := range exporters {
		require.NoError(t, createEPPService(ctx, kube[e], soakNS))
		w.setExported(e, dp.Namespace+"/"+dp.Pool, true)
		_, err := mci[e].InferencePoolV1().InferencePools(soakNS).Create(ctx, exportedPool(soakNS, anchorPool), metav1.CreateOptions{})
		require.NoError(t, err)
		w.setExported(e, soakNS+"/"+anchorPool, true)
		require.NoError(t, createRecreated(ctx, kube[e], mci[e], firstPort))
		w.setExported(e, recreatedNS+"/"+recreatedPool, true)
	}
	// The regional route, restricted to the first exporter's region.
	gatewayCluster, err := cs.Cluster(dp.GatewayCluster)
	require.NoError(t, err)
	require.NoError(t, setUpRegionalRoute(ctx, dp, mci, gatewayclient.NewForConfigOrDie(gatewayCluster.Config), exporters, topo.Regional), "the regional route")
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		code, instance, _, err := dp.SendTo(ctx, regionalHost)
		return err == nil && code == 200 && strings.HasPrefix(instance, topo.Regional+"/"), nil
	}), "the regional route must be served by %s", topo.Regional)
	names, err := localclusterset.StartNameProxy()
	require.NoError(t, err)
	defer func() { _ = names.Close() }()
	named := &rotator{cs: cs, names: names, watcher: topo.Named[0], member: topo.Named[1], watcherKube: kube[topo.Named[0]], memberKube: kube[topo.Named[1]]}
	require.NoError(t, named.setUp(ctx), "moving %s's kubeconfig of %s to a member Secret that names it by a host name", named.watcher, named.member)
	rot := &rotator{cs: cs, watcher: topo.Rotating[0], member: topo.Rotating[1], watcherKube: kube[topo.Rotating[0]], memberKube: kube[topo.Rotating[1]]}
	require.NoError(t, rot.setUp(ctx), "moving %s's kubeconfig of %s to a member Secret", rot.watcher, rot.member)

	// An informer per cluster on every namespace's imports, through the
	// aggregator, built as mci-sidecar's: a call that finds no server is
	// tried again within a second (pkg/informerhealth), and a starting
	// kube-apiserver's Retry-After is not waited out (its client's
	// noserver.WithoutRetryAfter).
	var views []*view
	infCtx, stopInformers := context.WithCancel(context.Background())
	defer stopInformers()
	viewWatches := informerhealth.NewTracker("soak_view")
	for _, c := range cs.Clusters {
		sidecarLike := rest.CopyConfig(c.Config)
		sidecarLike.Wrap(noserver.WithoutRetryAfter)
		viewClient := mciclient.NewForConfigOrDie(sidecarLike)
		imports := viewClient.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll)
		inf := viewWatches.NewInformer(c.Name+"/inferencepoolimports", informerhealth.ListWatch(viewClient, imports.List, imports.Watch), &v1alpha1.InferencePoolImport{})
		go inf.RunWithContext(infCtx)
		v := &view{cluster: c.Name, client: mci[c.Name], informer: inf}
		for _, port := range c.MCIAPIServerReplicaPorts {
			rc := rest.CopyConfig(c.Config)
			rc.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
			rc.TLSClientConfig.CAData = cs.MCIServingCA()
			rc.TLSClientConfig.CAFile = ""
			v.replicas = append(v.replicas, mciclient.NewForConfigOrDie(rc))
		}
		views = append(views, v)
	}
	for _, v := range views {
		syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
		require.True(t, cache.WaitForCacheSync(syncCtx.Done(), v.informer.HasSynced), "the informer of %s must sync", v.cluster)
		cancel()
	}
	var deletesMu sync.Mutex
	var deletes []deletion
	for _, v := range views {
		require.NoError(t, v.watchDeletes(w, func(d deletion) {
			logf("UNEXPECTED: import %s left the informer of %s: %s", d.Import, d.Cluster, d.Why)
			deletesMu.Lock()
			deletes = append(deletes, d)
			deletesMu.Unlock()
		}))
	}
	mon := &monitor{w: w, views: views, timeout: 90 * time.Second, logf: logf}
	monCtx, stopMonitor := context.WithCancel(context.Background())
	defer stopMonitor()
	go mon.run(monCtx, 250*time.Millisecond)
	mon.await("export", "initial state", 0, false)
	require.Empty(t, failedOf(mon.settle(time.Minute)), "the views must equal the initial exports")

	watchers := startWatchers(infCtx, cs.Names(), mci, cfg.Watchers)
	procs, err := mciProcesses(cs)
	require.NoError(t, err)

	phase := cfg.Duration - cfg.Warmup - cfg.Tail
	opts := scheduleOptions{
		Phase:      phase,
		Gap:        [2]time.Duration{8 * time.Second, 25 * time.Second},
		OverlapGap: [2]time.Duration{time.Second, 4 * time.Second},
		Hold:       [2]time.Duration{6 * time.Second, 20 * time.Second},
		// Export changes run from the start and stop halfway into the
		// quiet tail.
		Warmup: cfg.Warmup, ExportsUntil: phase + cfg.Tail/2,
	}
	faults := newSchedule(cfg.Seed, topo, opts)
	plan := planWithdrawals(cfg.Seed, topo, opts, faults)
	logf("soak: schedule of seed %d: %d faults over %s after a %s warm-up, then a %s quiet tail:\n%s%d withdrawals of the data path pool (from the faults' start):\n%s",
		cfg.Seed, len(faults), phase, cfg.Warmup, cfg.Tail, describeSchedule(faults), len(plan), describeWithdrawals(plan))

	// Traffic, export changes and runtime sampling run from here to the
	// end; faults from the end of the warm-up to the tail.
	begin := time.Now()
	logw.since(begin)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var running sync.WaitGroup
	tr := &traffic{dp: dp, maxInFlight: 64, regional: true}
	running.Go(func() { tr.run(runCtx, cfg.Rate) })
	ex := &exporter{
		rng: rand.New(rand.NewPCG(cfg.Seed, 0xe4)), clients: mci, exporters: exporters, gateway: mci[dp.GatewayCluster],
		dpNS: dp.Namespace, dpPool: dp.Pool, w: w, mon: mon, logf: logf, gone: 3 * time.Minute, plan: plan, start: begin.Add(cfg.Warmup),
	}
	exCtx, stopExports := context.WithCancel(ctx)
	defer stopExports()
	running.Go(func() { ex.run(exCtx) })
	every := min(10*time.Second, max(2*time.Second, cfg.Duration/120))
	running.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			for _, p := range procs {
				p.read(runCtx)
			}
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	})

	// Heap profiles of the replicas when the figures start (the end of
	// the warm-up) and at the end: a live heap that grows is then shown by
	// allocation site.
	heapDir := filepath.Join(cfg.Out, "heap")
	require.NoError(t, os.RemoveAll(heapDir))
	saveProfiles := func(ctx context.Context, label string) {
		for _, p := range procs {
			if err := p.saveHeapProfile(ctx, heapDir, label); err != nil {
				logf("soak: %v", err)
			}
		}
	}
	running.Go(func() {
		select {
		case <-runCtx.Done():
		case <-time.After(time.Until(begin.Add(cfg.Warmup))):
			saveProfiles(runCtx, "start")
		}
	})

	replicas := map[string]int{}
	for _, c := range cs.Clusters {
		replicas[c.Name] = len(c.MCIAPIServerReplicaPorts)
	}
	inj := &injector{cs: cs, dp: dp, kube: kube, mci: mci, gens: &generations{}, w: w, mon: mon, rot: rot, named: named, log: logf, start: begin.Add(cfg.Warmup),
		healBound: cfg.HealTarget, mciReplicas: replicas}
	inj.run(ctx, faults)
	// The quiet tail: export changes stop halfway so that the end figures
	// are taken on a settled ClusterSet. The sleeps are the soak's
	// schedule.
	time.Sleep(time.Until(begin.Add(cfg.Duration - cfg.Tail/2)))
	stopExports()
	time.Sleep(time.Until(begin.Add(cfg.Duration)))
	stopRun()
	running.Wait()
	end := time.Now()
	saveProfiles(ctx, "end")

	measurements := mon.settle(mon.timeout)
	stopMonitor()
	requests, notSent := tr.snapshot()
	withdrawals, changes := ex.result()
	deletesMu.Lock()
	r := buildReport(cfg, begin, end, faults, inj.result(), measurements, requests, notSent, withdrawals, changes, watchers.result(), procs, topo, dp.Model)
	r.addDeletions(deletes, begin)
	mon.mu.Lock()
	r.addLosses(mon.losses, begin)
	mon.mu.Unlock()
	deletesMu.Unlock()
	md := r.markdown()
	fmt.Println(md)
	require.NoError(t, r.write(cfg.Out, md))
	logf("soak: results in %s", cfg.Out)
	for _, f := range r.Failures {
		t.Errorf("target missed: %s", f)
	}
	for _, n := range r.NotJudged {
		t.Logf("not judged: %s", n)
	}
	for _, p := range cs.Processes() {
		if !p.Alive {
			t.Errorf("%s is not running at the end (log %s)", p.Name, p.Log)
		}
	}
	for _, p := range cs.DataPathServers() {
		if !p.Alive {
			t.Errorf("%s is not running at the end (log %s)", p.Name, p.Log)
		}
	}
}

func failedOf(ms []*measurement) []string {
	var out []string
	for _, m := range ms {
		if m.Failed {
			out = append(out, m.Label+": "+m.Last)
		}
	}
	return out
}

func createNamespace(ctx context.Context, kube kubernetes.Interface, name string) error {
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// createEPPService gives the soak's pools in ns their EPP Service "epp":
// a LoadBalancer with an ingress address as a cloud controller sets it,
// and a ready endpoint as the EndpointSlice controller writes it
// (documentation range: nothing is sent there; the data path's own pool
// has the real EPP), so their imports are Ready.
func createEPPService(ctx context.Context, kube kubernetes.Interface, ns string) error {
	svc, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "epp", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": "epp"},
			Ports:    []corev1.ServicePort{{Name: "ext-proc", Port: 9002}, {Name: "grpc-health", Port: 9003}, {Name: "http-metrics", Port: 9090}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.9"}}
	if _, err := kube.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		return err
	}
	_, err = kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "epp-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "epp"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("ext-proc"), Port: ptr.To[int32](9002)}},
	}, metav1.CreateOptions{})
	return err
}

// watchers are raw watches on every namespace's imports through the
// aggregators, as many clients of mci would open: each lists, watches
// from the list's resourceVersion and starts over when its watch ends.
type watchers struct {
	events, reopened, errors atomic.Int64
	lastErr                  atomic.Value
	n                        int
}

type watcherResult struct {
	Watchers int    `json:"watchers"`
	Events   int64  `json:"events"`
	Reopened int64  `json:"reopened"`
	Errors   int64  `json:"errors"`
	LastErr  string `json:"last_error,omitempty"`
}

func startWatchers(ctx context.Context, clusters []string, clients map[string]mciclient.Interface, n int) *watchers {
	ws := &watchers{n: n}
	for i := range n {
		imports := clients[clusters[i%len(clusters)]].InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll)
		go func() {
			for ctx.Err() == nil {
				list, err := imports.List(ctx, metav1.ListOptions{})
				if err == nil {
					var wi watch.Interface
					if wi, err = imports.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion}); err == nil {
						for ev := range wi.ResultChan() {
							if ev.Type == watch.Error {
								ws.lastErr.Store(fmt.Sprint(ev.Object))
								ws.errors.Add(1)
								continue
							}
							ws.events.Add(1)
						}
						wi.Stop()
						ws.reopened.Add(1)
					}
				}
				if err != nil && ctx.Err() == nil {
					ws.errors.Add(1)
					ws.lastErr.Store(err.Error())
					time.Sleep(time.Second) // paces a failing watcher's retries
				}
			}
		}()
	}
	return ws
}

func (ws *watchers) result() watcherResult {
	last, _ := ws.lastErr.Load().(string)
	return watcherResult{Watchers: ws.n, Events: ws.events.Load(), Reopened: ws.reopened.Load(), Errors: ws.errors.Load(), LastErr: last}
}

// stampWriter prefixes each write with the time since the soak began.
type stampWriter struct {
	mu    sync.Mutex
	w     io.Writer
	begin time.Time
}

func (s *stampWriter) since(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begin = t
}

func (s *stampWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.begin.IsZero() {
		if _, err := fmt.Fprintf(s.w, "[+%6.1fs] ", time.Since(s.begin).Seconds()); err != nil {
			return 0, err
		}
	}
	return s.w.Write(p)
}
