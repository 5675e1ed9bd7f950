package benchrouting

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/dynamic"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// Traffic the sidecar does not see. In the family's other workloads every
// request enters through the importing cluster's gateway, so mci-sidecar
// sees all the traffic its clusters serve. Here part of it does not:
//
//   - direct-30 and direct-60: 30% or 60% of the requests come from the
//     exporting clusters' own users (half each), who send to their own
//     cluster's gateway and EPP (the harness's direct gateway, the one the
//     references use). Their conversations have their own groups and
//     prompts (workload.Population), drawn by the same generator; they
//     meet the same servers, and fill and evict the same caches. Every
//     routing meets the same local traffic, which always goes to its own
//     cluster: only the importing users' requests are routed.
//   - two-importers: two importing clusters' sidecars, each with its own
//     users (half each, their own groups and prompts), share the
//     exporters. The second importing cluster (secondImporterCluster)
//     serves no pool of its own: its gateway's route names the import, so
//     its mci-sidecar routes over the two exporters, as the first routes
//     over them and its own servers. It is started with the data path's
//     first run that needs it, with its own gateway, for as long as the
//     data path runs (its memory lives as long as the first one's). It
//     differs from replicas of one sidecar ("<policy>@<n>") in whose
//     requests each sees: replicas are dealt the requests of one
//     population in turn, so each sees every conversation's turns in
//     part, and they are judged against one replica; each importer here
//     sees all of its own users' requests and none of the other's, and
//     the EPPs count each one's requests apart (by the cluster that
//     relayed them).
//
// The references route every request the sidecars route: the Oracle
// reads every server's cache, which all the traffic fills, so it knows
// what the local users' requests left there; it and RoundRobin route both
// importers' users, the second importer's over the exporters alone (all
// its cluster reaches).

const (
	// secondImporterEntry is where the second importer's users enter.
	secondImporterEntry = "importer-2"
	// secondImporterCluster runs the second importer's mci-sidecar and
	// its gateway, on secondImporterHost of its loopback block: a member
	// of the ClusterSet that imports the pool and serves none.
	secondImporterCluster = "cluster-d"
	secondImporterHost    = 165
)

// unseenVariant is a way part of the traffic escapes the sidecar: the
// populations of the workload.
type unseenVariant struct {
	name    string
	users   []workload.Population
	summary string
	// shared: the populations share their system prompts
	// (workload.Profile.SharedSystemPrompts).
	shared bool
	// seed is the named workload's (unseenFamily).
	seed uint64
}

var unseenVariants = []unseenVariant{
	{"direct-30", []workload.Population{{Entry: "", Share: 0.7}, {Entry: "cluster-a", Share: 0.15}, {Entry: "cluster-c", Share: 0.15}},
		"30% of the requests from the exporters' own users (15% each), sent to their own cluster's gateway", false, 29},
	{"direct-60", []workload.Population{{Entry: "", Share: 0.4}, {Entry: "cluster-a", Share: 0.3}, {Entry: "cluster-c", Share: 0.3}},
		"60% of the requests from the exporters' own users (30% each), sent to their own cluster's gateway", false, 30},
	{"two-importers", []workload.Population{{Entry: "", Share: 0.5}, {Entry: secondImporterEntry, Share: 0.5}},
		"two importing sidecars with their own users (half each) sharing the exporters", false, 31},
	// The exporters' own users start the same conversations (one
	// application, deployed in every cluster): what the sidecar does not
	// see is what it routes next, which only the EPPs' prefix summaries
	// tell it.
	{"direct-30-shared", []workload.Population{{Entry: "", Share: 0.7}, {Entry: "cluster-a", Share: 0.15}, {Entry: "cluster-c", Share: 0.15}},
		"30% of the requests from the exporters' own users (15% each), sent to their own cluster's gateway, with the same system prompts as the importing cluster's users", true, 33},
}

// unseenFamily are the named workloads of the variants: shared-prompts's
// shape (8 groups of 2,000-token system prompts over all the users,
// multi-turn, 2 batch places per server, 70%), on seeds of their own.
var unseenFamily = func() map[string]spec {
	out := map[string]spec{}
	for _, v := range unseenVariants {
		p := withUsers(conversations(v.seed, 8, 2000, 24, 8, 16, 0.1), v.users)
		p.SharedSystemPrompts = v.shared
		out[v.name] = spec{
			Profile: p, Load: 0.7, ServersPerCluster: 2, Batch: 2,
			Summary: v.summary + "; 8 groups over all the users, 2,000-token system prompts, multi-turn (8 turns), 10% one-shot, 2 batch places per server, 70%",
		}
	}
	// The smoke's one case of both ways, on shared-prompts's servers:
	// the code paths of the exporters' own gateways and of the second
	// importer in one workload, seconds per policy.
	out[unseenSmoke] = spec{
		Profile: withUsers(conversations(32, 8, 2000, 24, 8, 16, 0.1), []workload.Population{
			{Entry: "", Share: 0.4}, {Entry: secondImporterEntry, Share: 0.3}, {Entry: "cluster-a", Share: 0.15}, {Entry: "cluster-c", Share: 0.15}}),
		Load: 0.7, ServersPerCluster: 2, Batch: 2,
		Summary: "the smoke's case: 30% of the requests from the exporters' own users, the rest from two importing sidecars' users; 8 groups over all the users, 2,000-token system prompts, multi-turn (8 turns), 10% one-shot, 2 batch places per server, 70%",
	}
	return out
}()

// unseenSmoke is the workload of traffic the sidecar does not see that
// the smoke runs.
const unseenSmoke = "unseen-smoke"

// The drawn workloads of the variants (workload.Draw of the seed, with
// the variant's populations), by variant: the tuning seeds anyone may run
// while changing a rule, and the held-out ones that only check (the full
// profile runs them; workload.HeldOutSeeds says why they are apart).
var (
	unseenTuningSeeds  = map[string][]uint64{"direct-30": {11}, "direct-60": {12}, "two-importers": {13}, "direct-30-shared": {14}}
	unseenHeldOutSeeds = map[string][]uint64{"direct-30": {9201}, "direct-60": {9202}, "two-importers": {9203}, "direct-30-shared": {9204}}
)

func withUsers(p workload.Profile, users []workload.Population) workload.Profile {
	p.Users = users
	return p
}

// unseenName is the name of the drawn workload of variant and seed, after
// prefix (heldOutPrefix or tuningPrefix).
func unseenName(prefix, variant string, seed uint64) string {
	return prefix + variant + "-" + strconv.FormatUint(seed, 10)
}

// unseenSpecOf is the workload of that name among the variants' named and
// drawn ones.
func unseenSpecOf(name string) (spec, bool) {
	if w, ok := unseenFamily[name]; ok {
		return w, true
	}
	for prefix, seeds := range map[string]map[string][]uint64{heldOutPrefix: unseenHeldOutSeeds, tuningPrefix: unseenTuningSeeds} {
		for _, v := range unseenVariants {
			s, ok := strings.CutPrefix(name, prefix+v.name+"-")
			if !ok {
				continue
			}
			seed, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				// Another variant whose name starts with this one's.
				continue
			}
			if !slices.Contains(seeds[v.name], seed) {
				return spec{}, false
			}
			w := drawn(seed)
			w.Profile.Users, w.Profile.SharedSystemPrompts = v.users, v.shared
			w.Summary = v.summary + "; " + w.Summary
			return w, true
		}
	}
	return spec{}, false
}

// unseenOrder is the variants' named workloads, then their held-out ones.
func unseenOrder() []string {
	var out []string
	for _, v := range unseenVariants {
		out = append(out, v.name)
	}
	for _, v := range unseenVariants {
		for _, s := range unseenHeldOutSeeds[v.name] {
			out = append(out, unseenName(heldOutPrefix, v.name, s))
		}
	}
	return out
}

// withUnseen is workloads with unseenOrder's inserted, each after the
// last workload on the same servers (so that the servers' Pods do not
// change for it), or at the end.
func withUnseen(workloads []string) []string {
	out := slices.Clone(workloads)
	for _, name := range unseenOrder() {
		w, _ := unseenSpecOf(name)
		at := len(out)
		for i := len(out) - 1; i >= 0; i-- {
			if o, ok := specOf(out[i]); ok && shapeOf(o) == shapeOf(w) {
				at = i + 1
				break
			}
		}
		out = slices.Insert(out, at, name)
	}
	return out
}

func shapeOf(w spec) serverShape {
	return serverShape{servers: w.ServersPerCluster, batch: w.Batch, far: w.Far}
}

// isDirectEntry: requests of that entry go to an exporting cluster's own
// gateway, past every sidecar.
func isDirectEntry(entry string) bool { return slices.Contains(clusterNames, entry) }

// directShare is the share of w's requests sent to the exporters' own
// gateways.
func directShare(w spec) float64 {
	s := 0.0
	for _, u := range w.Profile.Users {
		if isDirectEntry(u.Entry) {
			s += u.Share
		}
	}
	return s
}

// importers is how many importing sidecars w's users send through.
func importers(w spec) int {
	n := 1
	for _, u := range w.Profile.Users {
		if u.Entry == secondImporterEntry {
			n++
		}
	}
	return n
}

// hasUnseenTraffic: some of w's traffic is not seen by a sidecar that
// routes the rest.
func hasUnseenTraffic(w spec) bool { return directShare(w) > 0 || importers(w) > 1 }

// entryRoutes say which router sends a request, by its entry: the
// policy's for the importing users, the exporter's own gateway for its
// local users, the second importer's sidecar for its users.
type entryRoutes struct {
	main    router
	byEntry map[string]router
	// hosts are the mci-sidecars that route (for their home decisions).
	hosts []string
}

func (x *entryRoutes) of(entry string) router {
	if r, ok := x.byEntry[entry]; ok {
		return r
	}
	return x.main
}

// toGateway sends every request to one gateway.
type toGateway string

func (g toGateway) route(context.Context, []byte) (string, func(), error) {
	return string(g), noop, nil
}

// entryRoutesFor are the routes of a run of policy on w, whose main router
// is main. A second importer's sidecar starts with the first run that
// needs it and runs as long as the data path.
func (e *env) entryRoutesFor(ctx context.Context, w spec, policy string, main router) (*entryRoutes, error) {
	x := &entryRoutes{main: main, byEntry: map[string]router{}, hosts: sidecarHosts(main)}
	for _, u := range w.Profile.Users {
		switch {
		case isDirectEntry(u.Entry):
			x.byEntry[u.Entry] = toGateway(e.direct[u.Entry])
		case u.Entry == secondImporterEntry && isReference(policy):
			// The second importer's users reach only the exporters,
			// whichever routing chooses among them.
			r, ok := main.(interface{ over([]string) router })
			if !ok {
				return nil, fmt.Errorf("the reference %s cannot route the second importer's users over the exporters alone", policy)
			}
			x.byEntry[u.Entry] = r.over(exportingClusters)
		case u.Entry == secondImporterEntry:
			gw, err := e.secondImporter(ctx)
			if err != nil {
				return nil, err
			}
			x.byEntry[u.Entry] = viaSidecar{gateway: gw}
			x.hosts = append(x.hosts, sidecarHosts(viaSidecar{gateway: gw})...)
		}
	}
	return x, nil
}

// secondImporter is the gateway of the second importer's mci-sidecar,
// started when first asked for on this data path with its cluster's
// Gateway and route (ApplyImportingGateway), which carries the current
// policy as the sidecar starts (setPolicy then changes it as the data
// path's), stopped with the data path.
func (e *env) secondImporter(ctx context.Context) (string, error) {
	if e.importer2 != "" {
		return e.importer2, nil
	}
	c, err := e.cs.Cluster(secondImporterCluster)
	if err != nil {
		return "", err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return "", err
	}
	if err := e.cs.ApplyImportingGateway(ctx, secondImporterCluster, e.hostIP(secondImporterCluster, secondImporterHost)); err != nil {
		return "", fmt.Errorf("the second importer's Gateway and HTTPRoute in %s: %w", secondImporterCluster, err)
	}
	if e.policy != "" {
		if err := patchPolicy(ctx, dyn.Resource(httpRouteGVR).Namespace(e.dp.Namespace), e.dp.Pool, e.policy); err != nil {
			return "", fmt.Errorf("setting the cluster policy %s on the second importer's HTTPRoute: %w", e.policy, err)
		}
	}
	started := &processes{}
	gw, err := e.startSidecar(started, secondImporterEntry, secondImporterCluster, secondImporterHost)
	if err == nil {
		err = e.waitRoutes(ctx, gw)
	}
	if err != nil {
		started.stop()
		return "", fmt.Errorf("the second importer's mci-sidecar (logs in %s): %w", filepath.Join(e.dir, "logs"), err)
	}
	e.closeDirect = append(e.closeDirect, started.stop)
	e.importer2, e.importer2Dyn = gw, dyn
	logf("  the second importer's mci-sidecar up in %s: %s", secondImporterCluster, gw)
	return gw, nil
}

// routedFigures are what the routing decided of a policy's runs: the
// requests that entered through an importing sidecar (or the reference
// in their place), not those sent to the exporters' own gateways.
type routedFigures struct {
	Requests int `json:"requests"`
	// PrefixHit is from the requests' usage (cached_tokens /
	// prompt_tokens of those completed): the simulators' counters do not
	// tell the requests apart.
	PrefixHit    float64            `json:"prefix_hit_ratio"`
	TTFTP50      float64            `json:"ttft_p50_ms"`
	TTFTP99      float64            `json:"ttft_p99_ms"`
	ClusterShare map[string]float64 `json:"cluster_share"`
}

// routedOf is runs' routed figures; nil when every request was routed.
func routedOf(runs []*runResult) *routedFigures {
	var kept []*runResult
	direct := false
	for _, run := range runs {
		k := &runResult{}
		for _, o := range run.outcomes {
			if isDirectEntry(o.entry) {
				direct = true
				continue
			}
			k.outcomes = append(k.outcomes, o)
		}
		kept = append(kept, k)
	}
	if !direct {
		return nil
	}
	s := summarize(kept)
	return &routedFigures{Requests: s.Sent, PrefixHit: s.RequestHitRatio, TTFTP50: s.TTFTP50, TTFTP99: s.TTFTP99, ClusterShare: s.ClusterShare}
}

// routedHit is the hit ratio of what the routing decided: the routed
// requests' when some were not routed, else all (the simulators'
// counters).
func routedHit(pr *policyResult) figure {
	if pr.Routed == nil {
		return hit(pr)
	}
	return figureOf(pr, pr.Routed.PrefixHit, func(r repetition) float64 { return r.RoutedHit })
}

// unseenHitTarget is the share of the oracle's hit ratio the routed
// requests are to reach: 0.95, and 0.9 when more than half of the
// requests are sent past the sidecar (it knows less of what the caches
// hold).
func unseenHitTarget(w spec) float64 {
	if directShare(w) > 0.5 {
		return 0.9
	}
	return 0.95
}

// equalShareGap is the largest distance, in points, of one of the equal
// clusters' share of all the requests from an equal share.
func equalShareGap(pr *policyResult, w spec) float64 {
	var equal []string
	for _, c := range clusterNames {
		if c != w.Far {
			equal = append(equal, c)
		}
	}
	gap := 0.0
	for _, c := range equal {
		gap = max(gap, math.Abs(pr.ClusterShare[c]-1/float64(len(equal))))
	}
	return round(100*gap, 1)
}

// unseenGoals are the targets of the workloads with unseen traffic.
var unseenGoals = []goal{
	{"unseen traffic: routed hit ratio >= 0.95 of the oracle's (0.9 past half direct)", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		o := w.Policies[oraclePolicy]
		if o == nil || !hasUnseenTraffic(w.Spec) {
			return false, missed, ""
		}
		k := unseenHitTarget(w.Spec)
		return true, judge(routedHit(pr), routedHit(o), atLeast(k)), routedHit(pr).text("%.3f") + fmt.Sprintf(" against %.2f x ", k) + routedHit(o).text("%.3f")
	}},
	{"unseen traffic: each equal cluster within 5 points of an equal share", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		if !hasUnseenTraffic(w.Spec) {
			return false, missed, ""
		}
		g := equalShareGap(pr, w.Spec)
		v := missed
		if g <= 5 {
			v = met
		}
		return true, v, fmt.Sprintf("%.1f points off (a / b / c %.2f / %.2f / %.2f)", g, pr.ClusterShare["cluster-a"], pr.ClusterShare["cluster-b"], pr.ClusterShare["cluster-c"])
	}},
}

// The summary checks these targets after the family's.
// unseenTable is the table of a workload with unseen traffic: what the
// routing decided beside all the traffic, for each policy; "" for other
// workloads.
func unseenTable(policies []string, w *workloadResult) string {
	if !hasUnseenTraffic(w.Spec) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Traffic the sidecar does not see (%.0f%% sent to the exporters' own gateways, %d importing sidecars): routed requests (through the importers) and all of them.\n\n", 100*directShare(w.Spec), importers(w.Spec))
	b.WriteString("| routing | hit ratio routed / all | TTFT p50 routed / all | TTFT p99 routed / all | share a / b / c routed | share a / b / c all | furthest from equal (points) |\n|---|---|---|---|---|---|---|\n")
	for _, p := range policies {
		pr := w.Policies[p]
		if pr == nil {
			continue
		}
		r := pr.Routed
		if r == nil {
			r = &routedFigures{PrefixHit: pr.PrefixHit, TTFTP50: pr.TTFTP50, TTFTP99: pr.TTFTP99, ClusterShare: pr.ClusterShare}
		}
		fmt.Fprintf(&b, "| `%s` | %.3f / %.3f | %.0f / %.0f ms | %.0f / %.0f ms | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.1f |\n", p,
			r.PrefixHit, pr.PrefixHit, r.TTFTP50, pr.TTFTP50, r.TTFTP99, pr.TTFTP99,
			r.ClusterShare["cluster-a"], r.ClusterShare["cluster-b"], r.ClusterShare["cluster-c"],
			pr.ClusterShare["cluster-a"], pr.ClusterShare["cluster-b"], pr.ClusterShare["cluster-c"], equalShareGap(pr, w.Spec))
	}
	b.WriteString("\n")
	return b.String()
}
