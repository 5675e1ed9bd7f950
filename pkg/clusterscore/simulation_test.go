package clusterscore

import (
	"container/heap"
	"container/list"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// The affinity simulation: a seeded workload of the routing benchmark's
// generator (test/benchrouting/workload) played, in simulated time, over
// clusters of model servers with batch places, a FIFO queue and a prefix
// cache, through the pipeline as the sidecar calls it (one Pipeline and
// Memory per sidecar replica, requests dealt to the replicas in turn),
// with the time of each request as its Now. No clock, no goroutine: the
// same scenario gives the same figures on any machine.

// simCost is the routing benchmark's cost model: what a request holds a
// batch place for, by its uncached prompt tokens and its output.
var simCost = workload.Cost{Base: 5 * time.Millisecond, PrefillPerToken: 400 * time.Microsecond, DecodePerToken: 6 * time.Millisecond}

const (
	// simBlockTokens and simCacheBlocks are a server's prefix cache, as
	// in the routing benchmark: 1,024 blocks of 16 tokens. A cluster's
	// cache is its servers' together (a prefix-aware pick inside it).
	simBlockTokens = 16
	simCacheBlocks = 1024
	// simRequests is about how many requests a scenario plays.
	simRequests = 2400
	// simScrape is how often the pool metrics are read.
	simScrape = time.Second
	// simRemote is how much further one cluster of a remote scenario is.
	simRemote = 50 * time.Millisecond
)

// simScenario is one workload of the family and the clusters it runs on.
type simScenario struct {
	name     string
	profile  workload.Profile
	clusters int
	// servers per cluster, batch places per server.
	servers, batch int
	// load is the arrival rate's share of the capacity without cache.
	load float64
	// remote puts the last cluster simRemote further away.
	remote bool
	// saturate takes every batch place of the first cluster from the
	// arrival of the middle request to the last arrival, as the routing
	// benchmark's saturated-cluster workload does with traffic no router
	// sees: its running requests finish, and no other starts.
	saturate bool
	// uncounted: the EPPs count no requests in flight by relaying
	// cluster (PoolMetrics.RelayedInFlight), as upstream EPPs do not.
	uncounted bool
}

// simRequest is one request of a scenario, with its prompt's blocks as
// the sidecar hashes them and as the servers cache them.
type simRequest struct {
	workload.Request
	// direct: the request of a cluster's own users (Entry), sent to
	// that cluster without the router.
	direct  bool
	tokens  int
	blocks  []uint64 // the sidecar's prompt blocks
	cache   []uint64 // the servers' 16-token blocks
	cluster int
	sentAt  time.Duration
	replica int
}

// prepare generates the scenario's requests at its load.
func (s simScenario) prepare(t testing.TB) []*simRequest {
	t.Helper()
	p := s.profile
	// Calibrate on about as many requests as will be played.
	p.Duration, p.OutputTokens = 400*time.Second, 16
	p, _, err := workload.Calibrate(p, simCost, s.clusters*s.servers*s.batch, s.load)
	require.NoError(t, err)
	p.Duration = time.Duration(float64(simRequests) / p.Rate * float64(time.Second))
	reqs, err := workload.Generate(p)
	require.NoError(t, err)
	out := make([]*simRequest, len(reqs))
	for i, r := range reqs {
		body, err := json.Marshal(map[string]any{"model": "llm", "messages": r.Messages, "max_tokens": r.MaxTokens})
		require.NoError(t, err)
		blocks, err := promptprefix.Blocks(nil, simScope, body)
		require.NoError(t, err)
		out[i] = &simRequest{Request: r, direct: r.Entry != "", tokens: r.PromptTokens(), blocks: blocks, cache: tokenBlocks(r)}
	}
	return out
}

const simScope = "ns/llm"

// simImporter is the router's cluster, as the EPPs count its requests.
const simImporter = "importer"

// tokenBlocks are the chained hashes of the request's full blocks of
// simBlockTokens words, the words standing for tokens.
func tokenBlocks(r workload.Request) []uint64 {
	var out []uint64
	var d xxhash.Digest
	d.Reset()
	n, prev := 0, uint64(0)
	for _, m := range r.Messages {
		for _, w := range splitWords(m.Role + " " + m.Content) {
			_, _ = d.WriteString(w)
			_, _ = d.WriteString(" ")
			if n++; n == simBlockTokens {
				prev = d.Sum64() ^ prev*31
				out = append(out, prev)
				d.Reset()
				n = 0
			}
		}
	}
	return out
}

func splitWords(s string) []string {
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ' ' {
			if start >= 0 {
				out = append(out, s[start:i])
			}
			start = -1
		} else if start < 0 {
			start = i
		}
	}
	return out
}

// lru is a cluster's prefix cache: block hashes, least recently used
// first out.
type lru struct {
	capacity int
	entries  map[uint64]*list.Element
	order    *list.List
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, entries: map[uint64]*list.Element{}, order: list.New()}
}

// serve counts the request's leading blocks held, then holds them all.
func (c *lru) serve(blocks []uint64) int {
	hit := 0
	for hit < len(blocks) && c.entries[blocks[hit]] != nil {
		hit++
	}
	for _, b := range blocks {
		if e := c.entries[b]; e != nil {
			c.order.MoveToFront(e)
			continue
		}
		if c.order.Len() >= c.capacity {
			old := c.order.Back()
			delete(c.entries, old.Value.(uint64))
			c.order.Remove(old)
		}
		c.entries[b] = c.order.PushFront(b)
	}
	return hit
}

// simCluster is one cluster: batch places, a FIFO queue, a prefix cache.
type simCluster struct {
	name    string
	servers int
	places  int
	busy    int
	// running counts the tokens of the requests holding batch places,
	// which hold that much KV cache.
	running   int
	queue     []*simRequest
	cache     *lru
	roundTrip time.Duration
	// routed and direct count the requests sent there by the router or
	// by the cluster's own users, as its EPP counts them.
	routed, direct int
}

// kvUsage is the share of the cache the running requests hold.
func (c *simCluster) kvUsage() float64 {
	return min(float64(c.running)/float64(c.servers*simCacheBlocks*simBlockTokens), 1)
}

// simEvent is a request reaching a cluster or finishing there.
type simEvent struct {
	at     time.Duration
	finish bool
	req    *simRequest
}

type simEvents []simEvent

func (h simEvents) Len() int { return len(h) }
func (h simEvents) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].finish && !h[j].finish
}
func (h simEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simEvents) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *simEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// simRouter chooses the cluster of each request, and hears when one is
// answered (its first byte) and finished.
type simRouter interface {
	route(r *simRequest, now time.Duration, clusters []*simCluster, pools []*PoolMetrics) int
	firstByte(r *simRequest, ttft time.Duration)
	finished(r *simRequest)
}

// simResult is what a routing achieved on a scenario.
type simResult struct {
	// hit is the share of prompt tokens found in the cluster's cache.
	hit float64
	// maxShare is the largest share of requests one cluster took, and
	// shares each cluster's, of all the requests (direct ones too).
	maxShare float64
	shares   []float64
	// routedHit is hit over the routed requests alone.
	routedHit float64
	// wait is the mean time requests queued for a batch place; ttft
	// the median and 99th percentile of the time to first token
	// (round trip, queue, prefill).
	wait, ttftMean, ttftP50, ttftP99 time.Duration
	// sentSaturated is how many requests went to the saturated cluster
	// from the start of its saturation (saturate).
	sentSaturated int
}

// play runs the requests through the router over the scenario's clusters.
func (s simScenario) play(reqs []*simRequest, router simRouter) simResult {
	clusters := make([]*simCluster, s.clusters)
	for i := range clusters {
		clusters[i] = &simCluster{name: fmt.Sprintf("cluster-%c", 'a'+i), servers: s.servers, places: s.servers * s.batch, cache: newLRU(s.servers * simCacheBlocks)}
	}
	if s.remote {
		clusters[len(clusters)-1].roundTrip = simRemote
	}
	pools := make([]*PoolMetrics, s.clusters)
	sim := &simRun{clusters: clusters, router: router, taken: make([]int, s.clusters)}
	next, satAt, saturated := time.Duration(0), reqs[len(reqs)/2].At, false
	for _, r := range reqs {
		if s.saturate && !saturated && r.At >= satAt {
			sim.until(satAt)
			clusters[0].places, saturated = 0, true
		}
		sim.until(r.At)
		if r.At >= next {
			for i, c := range clusters {
				pools[i] = &PoolMetrics{AverageQueue: float64(len(c.queue)) / float64(c.servers), AverageKVCache: c.kvUsage(), ReadyPods: c.servers, UpdatedAt: simEpoch.Add(r.At)}
				if !s.uncounted {
					pools[i].RelayedRequests = map[string]float64{"": float64(c.direct), simImporter: float64(c.routed)}
				}
			}
			next = r.At + simScrape
		}
		r.sentAt = r.At
		if r.direct {
			r.cluster = slices.IndexFunc(clusters, func(c *simCluster) bool { return c.name == r.Entry })
			clusters[r.cluster].direct++
		} else {
			r.cluster = router.route(r, r.At, clusters, pools)
			clusters[r.cluster].routed++
		}
		sim.taken[r.cluster]++
		if saturated && r.cluster == 0 {
			sim.sentSaturated++
		}
		heap.Push(&sim.events, simEvent{at: r.At + clusters[r.cluster].roundTrip/2, req: r})
	}
	if saturated {
		// The saturation ends with the last arrival: the requests it held
		// start then.
		last := reqs[len(reqs)-1].At
		sim.until(last)
		c := clusters[0]
		c.places = s.servers * s.batch
		for len(c.queue) > 0 && c.busy < c.places {
			r := c.queue[0]
			c.queue = c.queue[1:]
			sim.start(c, r, last)
		}
	}
	sim.until(time.Duration(1 << 62))
	res := sim.result(len(reqs))
	res.sentSaturated = sim.sentSaturated
	return res
}

var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simRun is the state of one play.
type simRun struct {
	clusters []*simCluster
	router   simRouter
	events   simEvents
	taken    []int
	// sentSaturated counts the requests sent to a saturated cluster.
	sentSaturated int
	hitTokens     int
	allTokens     int
	// routedHitTokens and routedTokens are the routed requests' alone.
	routedHitTokens, routedTokens int
	waited                        time.Duration
	timesTaken                    []time.Duration
}

// until plays the events up to t.
func (s *simRun) until(t time.Duration) {
	for len(s.events) > 0 && s.events[0].at <= t {
		e := heap.Pop(&s.events).(simEvent)
		c := s.clusters[e.req.cluster]
		switch {
		case e.finish:
			c.busy--
			c.running -= e.req.tokens
			if !e.req.direct {
				s.router.finished(e.req)
			}
			if len(c.queue) > 0 && c.busy < c.places {
				r := c.queue[0]
				c.queue = c.queue[1:]
				s.start(c, r, e.at)
			}
		case c.busy < c.places:
			s.start(c, e.req, e.at)
		default:
			c.queue = append(c.queue, e.req)
		}
	}
}

// start gives a request a batch place: its prefill is what its cluster's
// cache does not hold.
func (s *simRun) start(c *simCluster, r *simRequest, at time.Duration) {
	c.busy++
	c.running += r.tokens
	cached := min(c.cache.serve(r.cache)*simBlockTokens, r.tokens)
	s.hitTokens += cached
	s.allTokens += r.tokens
	if !r.direct {
		s.routedHitTokens += cached
		s.routedTokens += r.tokens
	}
	s.waited += at - r.sentAt - c.roundTrip/2
	prefill := simCost.Base + time.Duration(r.tokens-cached)*simCost.PrefillPerToken
	ttft := at - r.sentAt + prefill + c.roundTrip/2
	s.timesTaken = append(s.timesTaken, ttft)
	if !r.direct {
		s.router.firstByte(r, ttft)
	}
	heap.Push(&s.events, simEvent{at: at + prefill + time.Duration(r.MaxTokens-1)*simCost.DecodePerToken, finish: true, req: r})
}

func (s *simRun) result(n int) simResult {
	res := simResult{hit: float64(s.hitTokens) / float64(max(s.allTokens, 1)), wait: s.waited / time.Duration(max(n, 1)),
		routedHit: float64(s.routedHitTokens) / float64(max(s.routedTokens, 1))}
	for _, k := range s.taken {
		res.maxShare = max(res.maxShare, float64(k)/float64(n))
		res.shares = append(res.shares, float64(k)/float64(n))
	}
	slices.Sort(s.timesTaken)
	if len(s.timesTaken) > 0 {
		var sum time.Duration
		for _, d := range s.timesTaken {
			sum += d
		}
		res.ttftMean = sum / time.Duration(len(s.timesTaken))
		res.ttftP50 = s.timesTaken[len(s.timesTaken)/2]
		res.ttftP99 = s.timesTaken[len(s.timesTaken)*99/100]
	}
	return res
}

// pipelineRouter is N sidecar replicas of one configuration, each with
// its own Memory, the requests dealt to them in turn.
type pipelineRouter struct {
	replicas []*Pipeline
	rots     []*Rotation
	cands    []Candidate
	order    []int
}

func newPipelineRouter(t testing.TB, config string, replicas int) *pipelineRouter {
	t.Helper()
	cfg, err := routingpolicy.Parse(config)
	require.NoError(t, err)
	pr := &pipelineRouter{}
	for i := range replicas {
		p, err := New(cfg, scheduling.DefaultConfig(), NewMemory(DefaultMemoryOptions()))
		require.NoError(t, err)
		// Ties broken by a seeded source: the same figures every run.
		p.intN = rand.New(rand.NewPCG(uint64(i)+1, 23)).IntN
		// The chain picker's filter chain too, from one source, whichever
		// of its pooled schedulers picks.
		src := rand.NewPCG(uint64(i)+1, 29)
		p.schedulers.New = func() any { return scheduling.New(scheduling.DefaultConfig(), src) }
		pr.replicas = append(pr.replicas, p)
	}
	return pr
}

func (pr *pipelineRouter) route(r *simRequest, now time.Duration, clusters []*simCluster, pools []*PoolMetrics) int {
	if pr.cands == nil {
		for _, c := range clusters {
			pr.cands = append(pr.cands, Candidate{Name: c.name, Weight: 1, Health: HealthServing})
		}
		for range pr.replicas {
			pr.rots = append(pr.rots, NewRotation(pr.cands))
		}
	}
	for i := range pr.cands {
		pr.cands[i].Pool = pools[i]
	}
	r.replica = r.Index % len(pr.replicas)
	p := pr.replicas[r.replica]
	req := &Request{Criticality: scheduling.Standard, Now: simEpoch.Add(now), Scope: simScope, Blocks: r.blocks, Cluster: simImporter}
	var err error
	pr.order, err = p.Pick(req, pr.cands, pr.rots[r.replica], pr.order[:0], nil)
	if err != nil || len(pr.order) == 0 {
		panic(fmt.Sprintf("no cluster for request %d: %v", r.Index, err))
	}
	c := pr.cands[pr.order[0]].Name
	p.Memory().Observed.Started(simScope, c, req.Now)
	p.Memory().Served(req, c)
	return pr.order[0]
}

func (pr *pipelineRouter) firstByte(r *simRequest, ttft time.Duration) {
	pr.replicas[r.replica].Memory().Observed.FirstByte(simScope, pr.cands[r.cluster].Name, ttft)
}

func (pr *pipelineRouter) finished(r *simRequest) {
	pr.replicas[r.replica].Memory().Observed.Finished(simScope, pr.cands[r.cluster].Name, false)
}

// groupOracle pins each conversation group to a cluster, the groups dealt
// to the clusters in turn as they first appear; a request of no group goes
// to the cluster with the fewest requests waiting or served.
type groupOracle struct{ pinned map[int]int }

func (o *groupOracle) route(r *simRequest, _ time.Duration, clusters []*simCluster, _ []*PoolMetrics) int {
	if r.Group >= 0 {
		if c, ok := o.pinned[r.Group]; ok {
			return c
		}
		o.pinned[r.Group] = len(o.pinned) % len(clusters)
		return o.pinned[r.Group]
	}
	best := 0
	for i, c := range clusters {
		if c.busy+len(c.queue) < clusters[best].busy+len(clusters[best].queue) {
			best = i
		}
	}
	return best
}

func (o *groupOracle) firstByte(*simRequest, time.Duration) {}
func (o *groupOracle) finished(*simRequest)                 {}
