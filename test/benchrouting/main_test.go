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
// cluster-a and cluster-c export their pools. Each cluster has simulated
// model servers (test/simulator with its cost model: a prefix cache per
// server, TTFT from queueing and uncached prefill, decode time per token, a
// batch limit) behind its own mci-epp; the servers of the two remote
// clusters add a network round trip to each request, so that every path to
// them pays it.
//
// It runs a family of seeded workloads (config_test.go's family: load,
// groups, prompt lengths, batch places, conversation mixes, a far
// cluster, no shared prefix, a saturated cluster), so that no single
// workload can be tuned to. Each workload starts a data path of its own
// (simulators, EPPs and mci-sidecar with empty state). On each
// workload every policy meets the same requests, one after the other with
// every cache emptied before each run, interleaved over the repetitions
// with the order rotated each time, after an uncounted warm-up run through
// the sidecar (warmUp). The sidecar's policies are selected by
// the HTTPRoute's annotation mci.x-k8s.io/cluster-policy; "<policy>@<n>"
// sends the requests in turn through n mci-sidecar replicas (the data
// path's and n-1 started by the harness, each with its gateway). The
// references RoundRobin and Oracle bypass the sidecar's choice: the
// harness picks the cluster and sends the request to a gateway of that
// cluster's EPP (the same gateway code, in this process), and the EPP
// picks the server as it does for the sidecar. The report ends with a
// summary over the family against its targets (summary_test.go).
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
	"slices"
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

// BenchmarkRouting runs every workload of the family and each of its
// policies once per repetition (use -benchtime=1x).
func BenchmarkRouting(b *testing.B) {
	started := time.Now()
	res := &results{Profile: cfg.Profile, Started: started.UTC(), Config: cfg, Workloads: map[string]*workloadResult{}}
	res.LoadAverage[0] = loadAverage()
	defer func() {
		res.LoadAverage[1] = loadAverage()
		if res.Summary == nil { // the run stopped early: what it measured
			res.Summary, res.HeldOut = summarizeFamily(res), summarizeHeldOut(res)
		}
		res.Failed = b.Failed()
		res.Elapsed = time.Since(started).Round(time.Second).String()
		if err := res.write(cfg.Out); err != nil {
			b.Errorf("writing the results: %v", err)
		}
		logf("done in %s; results in %s", res.Elapsed, cfg.Out)
	}()
	logf("profile %s: workloads %v, policies %v, %s per run, %d repetitions (%d of traffic the sidecar does not see)", cfg.Profile, cfg.Workloads, cfg.Policies, cfg.RunDuration, cfg.Repetitions, cfg.repetitionsOf(unseenOrder()[0]))
	e := startEnv(b, cfg)
	ctx := context.Background()
	for _, name := range cfg.Workloads {
		w, _ := specOf(name)
		require.NoError(b, e.startDataPath(ctx, w), "workload %s", name)
		prof, capacity, err := calibrated(cfg, w)
		require.NoError(b, err)
		reqs, err := workload.Generate(prof)
		require.NoError(b, err)
		wr := &workloadResult{Spec: w, RateRPS: round(prof.Rate, 2), CapacityRPS: round(capacity, 2), Requests: len(reqs), Policies: map[string]*policyResult{}}
		res.Workloads[name] = wr
		logf("workload %s: %d requests at %.1f req/s (capacity %.1f req/s)", name, len(reqs), prof.Rate, capacity)
		require.NoError(b, warmUp(ctx, e, w, name, prof), "workload %s: warm-up", name)
		runs := map[string][]*runResult{}
		for rep := range cfg.repetitionsOf(name) {
			for _, policy := range rotate(cfg.policiesOf(w), rep) {
				// Each run's one-shot requests and conversations are its
				// own: mci-sidecar remembers the prompts of every run
				// (one memory for its policies), and a replayed prompt is one it
				// has seen, whose home it keeps, while the servers' caches
				// were emptied: a conversation moved off its home would
				// find its next turn remembered there from the run before
				// and go back. The groups' system prompts are the same in
				// every run, as an application's are.
				prof.OneShotSalt = runSalt(name, fmt.Sprintf("r%d-%s", rep+1, policy))
				prof.ConversationSalt = prof.OneShotSalt
				reqs, err := workload.Generate(prof)
				require.NoError(b, err)
				run, err := runPolicy(ctx, e, w, policy, reqs)
				require.NoError(b, err, "workload %s, policy %s", name, policy)
				runs[policy] = append(runs[policy], run)
				require.NoError(b, writeRecords(os.Getenv(recordsDirEnv), fmt.Sprintf("%s-r%d-%s", name, rep+1, policy), reqs, run))
				one := summarize([]*runResult{run})
				logf("  %s rep %d %-16s TTFT p50 %6.0f ms p99 %6.0f ms, hit %.2f, %.1f req/s, shed %.3f, errors %.3f, share %v",
					name, rep+1, policy, one.TTFTP50, one.TTFTP99, one.PrefixHit, one.Throughput, one.ShedRatio, one.ErrorRatio, one.ClusterShare)
			}
		}
		for policy, rs := range runs {
			wr.Policies[policy] = summarize(rs)
		}
	}
	var err error
	res.RegionFilter, err = checkRegionFilter(ctx, e)
	require.NoError(b, err, "the region filter check")
	res.Summary = summarizeFamily(res)
	res.HeldOut = summarizeHeldOut(res)
	checkSane(b, res)
}

// warmUp sends the workload once through the first sidecar policy of w
// (one replica), uncounted, when cfg.Warmup says so: mci-sidecar keeps
// one memory for all its policies (homes, the learned index), so without
// it the policy that runs first meets a sidecar that has never seen the
// workload's groups and those after it one that has, and the measure
// depends on the order. Its one-shot prompts and conversations are its
// own, as every run's.
func warmUp(ctx context.Context, e *env, w spec, name string, prof workload.Profile) error {
	policies := cfg.policiesOf(w)
	i := slices.IndexFunc(policies, func(p string) bool { return !isReference(p) })
	if !cfg.Warmup || i < 0 {
		return nil
	}
	policy, _, err := parseReplicas(policies[i])
	if err != nil {
		return err
	}
	prof.OneShotSalt = runSalt(name, "warmup")
	prof.ConversationSalt = prof.OneShotSalt
	reqs, err := workload.Generate(prof)
	if err != nil {
		return err
	}
	run, err := runPolicy(ctx, e, w, policy, reqs)
	if err != nil {
		return err
	}
	one := summarize([]*runResult{run})
	logf("  %s warmed up through %s (uncounted): hit %.2f, errors %.3f", name, policy, one.PrefixHit, one.ErrorRatio)
	return nil
}

// runSalt starts the text of the one-shot prompts and conversations of a
// run of workload: the workload's name is part of it, since one-shot
// prompts of the same salt open with the same text whatever their length,
// so that no two workloads' runs send the same prompt.
func runSalt(workload, run string) string { return workload + "-" + run + "-" }

// calibrated is w's profile for one run, its rate calibrated to w.Load of
// the servers' capacity without cache hits, and that capacity.
func calibrated(cfg config, w spec) (workload.Profile, float64, error) {
	p := w.Profile
	p.Duration = cfg.RunDuration
	slots := len(clusterNames) * w.ServersPerCluster * w.Batch
	cost := workload.Cost{Base: cfg.Cost.Base, PrefillPerToken: cfg.Cost.PrefillPerToken, DecodePerToken: cfg.Cost.DecodePerToken}
	return workload.Calibrate(p, cost, slots, w.Load)
}

// rotate is list starting at its (k mod len)-th element.
func rotate(list []string, k int) []string {
	if len(list) == 0 {
		return nil
	}
	k %= len(list)
	return append(append([]string{}, list[k:]...), list[:k]...)
}
