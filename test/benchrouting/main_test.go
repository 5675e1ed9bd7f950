// Package benchrouting measures routing quality, what a user of
// multi-cluster inference pays for: time to first token, throughput and
// prefix-cache reuse, under each of mci-sidecar's cluster policies and two
// references, on a real local ClusterSet (test/localclusterset: etcd, a
// kube-apiserver and an mci-apiserver per cluster, the mci-epp and
// mci-sidecar binaries of `make build`).
//
// The setup: 3 clusters. cluster-b imports: it runs mci-sidecar and the
// Envoy-like gateway double (test/cmd/gateway), and has a local pool of its
// own (a shim pool: the HTTPRoute routes to it, and the sidecar picks among
// the local cluster and the clusters of the import of the same name).
// cluster-a and cluster-c export their pools. Each cluster has
// ServersPerCluster simulated model servers (test/simulator with its cost
// model: a prefix cache per server, TTFT from queueing and uncached
// prefill, decode time per token, a batch limit) behind its own mci-epp;
// the servers of the two remote clusters add a network round trip to each
// request, so that every path to them pays it.
//
// Every policy meets the same seeded workload (package workload), one
// after the other with every cache emptied before each run, interleaved
// over the repetitions with the order rotated each time. The sidecar's
// policies are selected by the HTTPRoute's annotation
// mci.x-k8s.io/cluster-policy; the references RoundRobin and Oracle bypass
// the sidecar's choice: the harness picks the cluster and sends the
// request to a gateway of that cluster's EPP (the same gateway code, in
// this process), and the EPP picks the server as it does for the sidecar.
//
// `make bench-routing` runs the full profile, `make bench-routing-smoke`
// (part of `make test`) a short one; results.json and results.md go to
// $MCI_BENCH_ROUTING_OUT (_output/bench-routing). Nothing starts unless
// -bench is given, so `go test ./...` runs only the unit tests.
package benchrouting

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

var cfg config

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	var err error
	if cfg, err = loadConfig(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-routing:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// BenchmarkRouting runs every scenario and policy once (use -benchtime=1x).
func BenchmarkRouting(b *testing.B) {
	started := time.Now()
	res := &results{Profile: cfg.Profile, Started: started.UTC(), Config: cfg, Scenarios: map[string]*scenarioResult{}}
	res.LoadAverage[0] = loadAverage()
	defer func() {
		res.LoadAverage[1] = loadAverage()
		res.Failed = b.Failed()
		res.Elapsed = time.Since(started).Round(time.Second).String()
		if err := res.write(cfg.Out); err != nil {
			b.Errorf("writing the results: %v", err)
		}
		logf("done in %s; results in %s", res.Elapsed, cfg.Out)
	}()
	logf("profile %s: scenarios %v, policies %v, %s per run, %d repetitions", cfg.Profile, cfg.Scenarios, cfg.Policies, cfg.RunDuration, cfg.Repetitions)
	e := startEnv(b, cfg)
	ctx := context.Background()
	for _, name := range cfg.Scenarios {
		prof, capacity, desc, err := scenarioWorkload(cfg, name)
		require.NoError(b, err)
		reqs, err := workload.Generate(prof)
		require.NoError(b, err)
		sr := &scenarioResult{Description: desc, RateRPS: round(prof.Rate, 2), CapacityRPS: round(capacity, 2), Requests: len(reqs), Policies: map[string]*policyResult{}}
		res.Scenarios[name] = sr
		logf("scenario %s: %d requests at %.1f req/s (capacity %.1f req/s)", name, len(reqs), prof.Rate, capacity)
		runs := map[string][]*runResult{}
		for rep := range cfg.Repetitions {
			for _, policy := range rotate(cfg.Policies, rep) {
				run, err := runPolicy(ctx, e, name, policy, reqs)
				require.NoError(b, err, "scenario %s, policy %s", name, policy)
				runs[policy] = append(runs[policy], run)
				one := summarize([]*runResult{run})
				logf("  %s rep %d %-13s TTFT p50 %6.0f ms p99 %6.0f ms, hit %.2f, %.1f req/s, shed %.3f, errors %.3f, idle-while-queueing %.1f%%, share %v",
					name, rep+1, policy, one.TTFTP50, one.TTFTP99, one.PrefixHit, one.Throughput, one.ShedRatio, one.ErrorRatio, 100*one.HerdingRatio, one.ClusterShare)
			}
		}
		for policy, rs := range runs {
			sr.Policies[policy] = summarize(rs)
		}
		if name == scenarioSharedPrefix {
			res.Policies = sr.Policies
		}
	}
	checkSane(b, res)
}

// scenarioWorkload is a scenario's workload, its rate calibrated to
// cfg.Load of the servers' capacity without cache hits.
func scenarioWorkload(cfg config, scenario string) (workload.Profile, float64, string, error) {
	p := cfg.Workload
	p.Duration = cfg.RunDuration
	var desc string
	switch scenario {
	case scenarioSharedPrefix:
		desc = fmt.Sprintf("workload %s: %d groups of conversations share %d-token system prompts (together %.1fx a server's prefix cache), %d conversations open, up to %d turns each resending the history; %.0f%% one-shot requests",
			cfg.WorkloadName, p.Groups, p.SystemTokens, float64(p.Groups*p.SystemTokens)/float64(max(cfg.Cost.CacheBlocks*cfg.Cost.BlockTokens, 1)),
			p.ActiveConversations, p.Turns, 100*p.OneShotShare)
	case scenarioNoPrefix:
		p.OneShotShare = 1
		p.OneShotTokens = p.SystemTokens + p.Turns/2*(p.UserTokens+p.OutputTokens)
		desc = fmt.Sprintf("one-shot requests of %d tokens, no shared prefix", p.OneShotTokens)
	case scenarioSaturated:
		desc = fmt.Sprintf("the shared-prefix workload; from mid-run every batch place of %s's servers is taken by its own background requests", saturatedCluster)
	default:
		return p, 0, "", fmt.Errorf("unknown scenario %q", scenario)
	}
	slots := len(clusterNames) * cfg.ServersPerCluster * cfg.Batch
	cost := workload.Cost{Base: cfg.Cost.Base, PrefillPerToken: cfg.Cost.PrefillPerToken, DecodePerToken: cfg.Cost.DecodePerToken}
	p, capacity, err := workload.Calibrate(p, cost, slots, cfg.Load)
	return p, capacity, desc, err
}

// rotate is list starting at its (k mod len)-th element.
func rotate(list []string, k int) []string {
	if len(list) == 0 {
		return nil
	}
	k %= len(list)
	return append(append([]string{}, list[k:]...), list[:k]...)
}
