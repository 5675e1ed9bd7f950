package clusterscore

import (
	"time"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// Memory is what the pipeline learns from the requests it routes: the
// prefix index, the session pins and the observations. One Memory serves
// every backend of a sidecar (entries are scoped by Request.Scope).
type Memory struct {
	Prefixes *promptprefix.Index
	Homes    *Homes
	Sessions *Sessions
	Observed *Observer
	Shares   *Shares
	Moved    *Moved
}

// MemoryOptions size a Memory.
type MemoryOptions struct {
	// PrefixBlocks is the prefix index's capacity in blocks.
	PrefixBlocks int
	// Sessions is how many sessions are pinned at most, for SessionTTL
	// after their last request.
	Sessions   int
	SessionTTL time.Duration
	// EWMAAlpha weighs a new sample of the observed averages.
	EWMAAlpha float64
	// HomeKeys is how many prompt prefixes' homes are remembered at most,
	// for HomeTTL after their last request (Homes); 0: the defaults.
	HomeKeys int
	HomeTTL  time.Duration
}

// DefaultMemoryOptions: 262,144 blocks (16 MiB of prompt text; 8 MiB of
// index), 100,000 sessions pinned for 10 minutes.
func DefaultMemoryOptions() MemoryOptions {
	return MemoryOptions{PrefixBlocks: 1 << 18, Sessions: 100_000, SessionTTL: 10 * time.Minute, EWMAAlpha: DefaultEWMAAlpha}
}

// NewMemory returns an empty memory.
func NewMemory(o MemoryOptions) *Memory {
	return &Memory{
		Prefixes: promptprefix.NewIndex(o.PrefixBlocks),
		Homes:    NewHomes(o.HomeKeys, o.HomeTTL),
		Sessions: NewSessions(o.Sessions, o.SessionTTL),
		Observed: NewObserver(o.EWMAAlpha),
		Shares:   NewShares(),
		Moved:    NewMoved(0),
	}
}

// Served records that cluster took the request: its prompt blocks are
// now likely cached there, its session is pinned there, and its home key
// counts one more request (wherever it was served: the home does not
// follow the serving cluster, but for a key placed where an EPP reported
// its prefix, which is pinned there: Homes). The sidecar calls it with
// the cluster whose EPP answered, which may not be the first of the
// order.
func (m *Memory) Served(req *Request, cluster string) {
	m.Prefixes.Record(req.Blocks, promptprefix.ClusterID(cluster))
	pin := uint32(0)
	if req.Home.Outcome == HomeReported && req.Home.Home == cluster {
		pin = promptprefix.ClusterID(cluster)
	}
	m.Homes.Served(req.Scope, homeKey(req.Blocks), pin, req.Now)
	if o := req.Home.Outcome; (o == HomeSplit || o == HomeFollowed) && len(req.Blocks) > 0 {
		// Where it was served, the lead or a cluster after it: its
		// history is there now.
		m.Moved.Record(req.Blocks[len(req.Blocks)-1], promptprefix.ClusterID(cluster))
	}
	m.Sessions.Pin(req.Scope, req.Session, cluster, req.Now)
}
