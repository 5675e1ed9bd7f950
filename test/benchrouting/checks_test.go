package benchrouting

import (
	"encoding/json"
	"fmt"
	"testing"
)

// resultKeys are the keys every policy of every scenario has in
// results.json.
var resultKeys = []string{"ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "throughput_rps", "prefix_hit_ratio", "shed_ratio"}

// checkSane fails the benchmark when its results do not have the shape of
// results.json or are not numbers a working harness can produce.
func checkSane(tb testing.TB, r *results) {
	tb.Helper()
	for _, err := range sanityErrors(r) {
		tb.Error(err)
	}
}

func sanityErrors(r *results) []error {
	var errs []error
	b, err := json.Marshal(r)
	if err != nil {
		return []error{err}
	}
	var doc struct {
		Workloads map[string]struct {
			Policies map[string]map[string]any `json:"policies"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return []error{err}
	}
	for _, name := range r.Config.Workloads {
		w, ok := doc.Workloads[name]
		if !ok {
			errs = append(errs, fmt.Errorf("results.json has no workload %s", name))
			continue
		}
		ws, _ := specOf(name)
		for _, p := range r.Config.policiesOf(ws) {
			obj, ok := w.Policies[p]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: no results of policy %s", name, p))
				continue
			}
			for _, k := range resultKeys {
				if _, ok := obj[k].(float64); !ok {
					errs = append(errs, fmt.Errorf("%s/%s: %s is not a number: %v", name, p, k, obj[k]))
				}
			}
		}
	}
	for name, w := range r.Workloads {
		errs = append(errs, workloadErrors(name, w)...)
	}
	if len(r.Workloads) > 0 && len(r.Summary) == 0 {
		errs = append(errs, fmt.Errorf("no summary over the family"))
	}
	errs = append(errs, heldOutErrors(r)...)
	errs = append(errs, regionErrors(r.RegionFilter)...)
	return errs
}

// workloadErrors checks one workload's policies, and what a working
// harness must show between them: the oracle reuses at least as much as
// round-robin where prefixes are shared, nothing is reused where none is,
// and a LocalFirst run stays local.
func workloadErrors(name string, w *workloadResult) []error {
	var errs []error
	for p, pr := range w.Policies {
		errs = append(errs, policyErrors(name, p, pr)...)
	}
	noPrefix := w.Spec.Profile.OneShotShare >= 1
	oracle, rr := w.Policies[oraclePolicy], w.Policies[rrPolicy]
	if !noPrefix && !w.Spec.Saturate && oracle != nil && rr != nil && oracle.PrefixHit < rr.PrefixHit {
		errs = append(errs, fmt.Errorf("%s: Oracle's prefix hit ratio %.3f is below RoundRobin's %.3f", name, oracle.PrefixHit, rr.PrefixHit))
	}
	// LocalFirst keeps the requests in the importing cluster while its
	// EPP serves: the check that the policy the harness set is the one
	// the sidecar applies.
	if lf := w.Policies["LocalFirst"]; lf != nil && !w.Spec.Saturate && lf.ClusterShare[importingCluster] < 0.9 {
		errs = append(errs, fmt.Errorf("%s/LocalFirst: only %.2f of the requests were served by the local cluster %s: is the policy applied?", name, lf.ClusterShare[importingCluster], importingCluster))
	}
	if noPrefix {
		for p, pr := range w.Policies {
			if pr.PrefixHit > 0.05 {
				errs = append(errs, fmt.Errorf("%s/%s: prefix hit ratio %.3f without shared prefixes", name, p, pr.PrefixHit))
			}
		}
	}
	return errs
}

// policyErrors checks one policy's figures: requests completed, times
// ordered, ratios between 0 and 1, the simulators' counters agreeing with
// the requests' usage.
func policyErrors(scenario, policy string, pr *policyResult) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s/%s: "+format, append([]any{scenario, policy}, args...)...))
	}
	if pr.Completed == 0 {
		bad("%d of %d requests completed", pr.Completed, pr.Sent)
	}
	if !(pr.TTFTP50 > 0 && pr.TTFTP50 <= pr.TTFTP99 && pr.TTFTP99 <= pr.E2EP99) {
		bad("TTFT p50 %v, p99 %v and e2e p99 %v ms are not positive and ordered", pr.TTFTP50, pr.TTFTP99, pr.E2EP99)
	}
	if pr.Throughput <= 0 {
		bad("throughput %v", pr.Throughput)
	}
	for k, v := range map[string]float64{"prefix hit": pr.PrefixHit, "shed": pr.ShedRatio, "error": pr.ErrorRatio, "herding": pr.HerdingRatio} {
		if !(v >= 0 && v <= 1) {
			bad("%s ratio %v is not between 0 and 1", k, v)
		}
	}
	if pr.Samples == 0 {
		bad("no load sample")
	}
	// The counters also count requests that failed after admission and
	// the saturating requests: close, not equal.
	if d := pr.PrefixHit - pr.RequestHitRatio; d > 0.1 || d < -0.1 {
		bad("the simulators' hit ratio %.3f and the requests' %.3f disagree", pr.PrefixHit, pr.RequestHitRatio)
	}
	return errs
}
