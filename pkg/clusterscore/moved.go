package clusterscore

import "sync"

// Moved remembers the conversations home placement moved off their home
// (HomeSplit) and where they went, so that their later turns follow them
// (HomeFollowed) while the other conversations of their groups still go
// home. A conversation is known by the last full block of its latest
// request: a client continuing it resends that prompt, so the next turn's
// blocks hold that block's hash at the same place, where the prefix index
// finds the cluster that served it holding the most of the prompt.
//
// Only moved conversations follow: a request spilled off a loaded home,
// or dealt while its key was new, goes home again next time, so that the
// home's group stays whole (letting every conversation follow wherever a
// turn of it went took the simulated family's shares from within 7 points
// of the clusters' to 20 off).
//
// It is bounded by two generations of at most capacity conversations
// each: when the newer fills up, the older is forgotten. It is safe for
// concurrent use.
type Moved struct {
	mu       sync.Mutex
	capacity int
	cur, old map[uint64]uint32
}

// DefaultMovedConversations is how many moved conversations a generation
// holds: twice the home keys' default, each a few conversations' worth.
const DefaultMovedConversations = 2 * DefaultHomeKeys

// NewMoved returns an empty record of generations of capacity
// conversations (DefaultMovedConversations when not above 0).
func NewMoved(capacity int) *Moved {
	if capacity <= 0 {
		capacity = DefaultMovedConversations
	}
	return &Moved{capacity: capacity, cur: map[uint64]uint32{}}
}

// Record records that the conversation whose latest request's last full
// block is block went to cluster.
func (m *Moved) Record(block uint64, cluster uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.cur[block]; !ok && len(m.cur) >= m.capacity {
		m.old, m.cur = m.cur, make(map[uint64]uint32, m.capacity)
	}
	m.cur[block] = cluster
}

// To returns the cluster the conversation whose request had last full
// block block was moved to; 0 when it is not known.
func (m *Moved) To(block uint64) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.cur[block]; ok {
		return c
	}
	return m.old[block]
}
