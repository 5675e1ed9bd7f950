package benchrouting

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mci-dev/mci/test/simulator"
)

// sidecarPolicies are mci-sidecar's cluster policies the benchmark
// compares, each selected by its value of the HTTPRoute's annotation
// mci.x-k8s.io/cluster-policy. A new policy is one more name here (or in
// MCI_BENCH_ROUTING_POLICIES): any name that is not a reference routing is
// taken as such an annotation value. HubReference is the llm-d hub's
// documented scoring in mci's pipeline, the peer reference.
var sidecarPolicies = []string{"Weighted", "HealthBased", "MetricsBased", "LocalFirst", "PrefixAffinity", "HubReference"}

// referenceRoutings bypass mci-sidecar: the harness picks the cluster
// itself and sends the request to that cluster's own gateway, whose EPP
// picks the server, as it does for the sidecar.
var referenceRoutings = map[string]func(context.Context, *env) (router, func(), error){
	// RoundRobin: plain round-robin over the 3 clusters.
	"RoundRobin": func(_ context.Context, e *env) (router, func(), error) {
		return &roundRobin{targets: e.directTargets()}, noop, nil
	},
	// Oracle: the cluster one of whose servers holds the longest cached
	// prefix of the request, asked of every server just before sending;
	// among clusters tied (none holds any of it, mostly) the one with the
	// fewest of the harness's requests in flight, then round-robin.
	"Oracle": func(_ context.Context, e *env) (router, func(), error) {
		return newOracle(e, e.directTargets()), noop, nil
	},
	// ClusterOracle: the Oracle's choice of the cluster, through EPPs
	// whose prefix filter is off (--prefix-queue-margin=-1), started for
	// its runs: placement by prefix at the cluster level only, the
	// reference the prefix-aware mci-epp is to beat end to end.
	clusterOraclePolicy: func(ctx context.Context, e *env) (router, func(), error) {
		targets, stop, err := e.startClusterLevelEPPs(ctx)
		if err != nil {
			return nil, nil, err
		}
		return newOracle(e, targets), stop, nil
	},
}

// referenceOrder is the order of the references after the sidecar's
// policies.
var referenceOrder = []string{"RoundRobin", "Oracle", clusterOraclePolicy}

func policyNames() []string {
	return append(append([]string{}, sidecarPolicies...), referenceOrder...)
}

func isReference(name string) bool {
	_, ok := referenceRoutings[name]
	return ok
}

// router says where a request goes: the gateway base URL. done is called
// once the request is answered.
type router interface {
	route(ctx context.Context, body []byte) (base string, done func(), err error)
}

func noop() {}

// viaSidecar sends every request to the importing cluster's gateway, where
// mci-sidecar chooses by the route's policy.
type viaSidecar struct{ gateway string }

func (v viaSidecar) route(context.Context, []byte) (string, func(), error) {
	return v.gateway, noop, nil
}

// sidecarHosts are the hosts of the mci-sidecars a router sends through
// (each shares its gateway's address, its metrics on 9090); none for the
// references, which route without one.
func sidecarHosts(rt router) []string {
	var gateways []string
	switch r := rt.(type) {
	case viaSidecar:
		gateways = []string{r.gateway}
	case *dealer:
		gateways = r.gateways
	}
	var hosts []string
	for _, g := range gateways {
		if u, err := url.Parse(g); err == nil {
			hosts = append(hosts, u.Hostname())
		}
	}
	return hosts
}

// routerFor returns the router of a policy, setting the route's policy
// first when the sidecar chooses, and starting the replicas of a policy
// "<policy>@<n>"; stop stops them after the run.
func (e *env) routerFor(ctx context.Context, policy string) (rt router, stop func(), err error) {
	if newRef, ok := referenceRoutings[policy]; ok {
		return newRef(ctx, e)
	}
	name, replicas, err := parseReplicas(policy)
	if err != nil {
		return nil, nil, err
	}
	if err := e.setPolicy(ctx, name); err != nil {
		return nil, nil, err
	}
	if replicas == 1 {
		return viaSidecar{gateway: e.dp.GatewayURL}, noop, nil
	}
	gateways, stop, err := e.startReplicas(ctx, replicas-1)
	if err != nil {
		return nil, nil, err
	}
	return &dealer{gateways: append([]string{e.dp.GatewayURL}, gateways...)}, stop, nil
}

// parseReplicas splits a policy "<policy>@<n>" into the sidecar's policy
// and n, the number of mci-sidecar replicas (1 without "@").
func parseReplicas(policy string) (string, int, error) {
	name, n, ok := strings.Cut(policy, "@")
	if !ok {
		return policy, 1, nil
	}
	replicas, err := strconv.Atoi(n)
	if err != nil || replicas < 1 || replicas > maxReplicas || name == "" || isReference(name) {
		return "", 0, fmt.Errorf("policy %q: want <cluster policy of the sidecar>@<1 to %d replicas>", policy, maxReplicas)
	}
	return name, replicas, nil
}

// dealer deals the requests in turn to the gateways of several
// mci-sidecar replicas: the round-robin front of the replica
// target.
type dealer struct {
	gateways []string
	next     atomic.Uint64
}

func (d *dealer) route(context.Context, []byte) (string, func(), error) {
	return d.gateways[(d.next.Add(1)-1)%uint64(len(d.gateways))], noop, nil
}

type target struct{ cluster, base string }

func (e *env) directTargets() []target {
	out := make([]target, 0, len(clusterNames))
	for _, c := range clusterNames {
		out = append(out, target{cluster: c, base: e.direct[c]})
	}
	return out
}

type roundRobin struct {
	targets []target
	next    atomic.Uint64
}

// over is round-robin over the targets of clusters only.
func (r *roundRobin) over(clusters []string) router {
	return &roundRobin{targets: within(r.targets, clusters)}
}

func (r *roundRobin) route(context.Context, []byte) (string, func(), error) {
	t := r.targets[(r.next.Add(1)-1)%uint64(len(r.targets))]
	return t.base, noop, nil
}

type oracle struct {
	e        *env
	targets  []target
	ties     atomic.Uint64
	mu       sync.Mutex
	inFlight map[string]int
}

// newOracle is the oracle sending to targets (a gateway per cluster).
func newOracle(e *env, targets []target) *oracle {
	return &oracle{e: e, targets: targets, inFlight: map[string]int{}}
}

func (o *oracle) route(ctx context.Context, body []byte) (string, func(), error) {
	return o.routeOver(ctx, body, o.targets)
}

// over is the oracle choosing among the targets of clusters only, its
// requests in flight counted with the oracle's.
func (o *oracle) over(clusters []string) router { return oracleOver{o, within(o.targets, clusters)} }

type oracleOver struct {
	o       *oracle
	targets []target
}

func (v oracleOver) route(ctx context.Context, body []byte) (string, func(), error) {
	return v.o.routeOver(ctx, body, v.targets)
}

// within is the targets of clusters.
func within(targets []target, clusters []string) []target {
	return slices.DeleteFunc(slices.Clone(targets), func(t target) bool { return !slices.Contains(clusters, t.cluster) })
}

func (o *oracle) routeOver(ctx context.Context, body []byte, targets []target) (string, func(), error) {
	servers := o.e.allServers()
	cached := make([]int, len(servers))
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			var m simulator.PrefixMatch
			errs[i] = call(ctx, http.MethodPost, s.url+"/admin/prefix-match", body, &m)
			cached[i] = m.CachedTokens
		})
	}
	wg.Wait()
	best := map[string]int{}
	for i, s := range servers {
		if errs[i] != nil {
			return "", nil, fmt.Errorf("oracle: %w", errs[i])
		}
		best[s.cluster] = max(best[s.cluster], cached[i])
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	t, err := pickOracle(targets, best, o.inFlight, o.ties.Add(1)-1)
	if err != nil {
		return "", nil, err
	}
	o.inFlight[t.cluster]++
	return t.base, func() {
		o.mu.Lock()
		o.inFlight[t.cluster]--
		o.mu.Unlock()
	}, nil
}

// pickOracle picks the target whose cluster holds the most cached tokens;
// among ties, the one with the fewest requests in flight; among those,
// the n-th in turn.
func pickOracle(targets []target, cached, inFlight map[string]int, n uint64) (target, error) {
	var tied []target
	for _, t := range targets {
		if len(tied) == 0 {
			tied = []target{t}
			continue
		}
		top := tied[0].cluster
		switch {
		case cached[t.cluster] > cached[top] || cached[t.cluster] == cached[top] && inFlight[t.cluster] < inFlight[top]:
			tied = []target{t}
		case cached[t.cluster] == cached[top] && inFlight[t.cluster] == inFlight[top]:
			tied = append(tied, t)
		}
	}
	if len(tied) == 0 {
		return target{}, fmt.Errorf("oracle: no cluster to send to")
	}
	return tied[n%uint64(len(tied))], nil
}
