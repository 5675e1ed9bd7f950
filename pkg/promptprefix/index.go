package promptprefix

import (
	"slices"
	"sync"
	"unsafe"
)

// Index remembers, for a bounded number of prompt blocks, which
// clusters most recently served a request whose prompt held that block.
// A block hash is chained with those before it (Blocks), so a block
// present for a cluster stands for the whole prefix up to it.
//
// It is a set-associative table allocated once: its memory is fixed at
// creation (Bytes) and never grows, whatever the traffic. A block maps to
// one set of indexWays entries; a new block takes a free entry of its set,
// else the one recorded least recently. Each entry holds up to
// indexClusters clusters, most recent first; a fifth evicts the oldest.
// Clusters are kept as 32-bit hashes of their names: a collision merely
// makes a prefix look cached where it is not, which the index, being
// approximate, allows.
//
// It is safe for concurrent use: the table is split in shards, each with
// its own lock, chosen by the block hash.
type Index struct {
	shards   [indexShards]indexShard
	capacity int
}

const (
	indexShards   = 16
	indexWays     = 8
	indexClusters = 4
)

type indexEntry struct {
	// key is the block hash; 0 marks a free entry (Blocks never
	// yields 0).
	key uint64
	// clusters are cluster ids, most recent first; 0 is none.
	clusters [indexClusters]uint32
	// used is the shard's clock when the block was last recorded.
	used uint32
}

type indexShard struct {
	mu      sync.RWMutex
	clock   uint32
	evicted uint64
	sets    uint64
	entries []indexEntry
}

// NewIndex returns an index of at least capacity blocks (rounded up
// to whole sets; at least one set per shard).
func NewIndex(capacity int) *Index {
	perShard := max(1, (capacity+indexShards*indexWays-1)/(indexShards*indexWays))
	x := &Index{capacity: perShard * indexShards * indexWays}
	for i := range x.shards {
		x.shards[i].sets = uint64(perShard)
		x.shards[i].entries = make([]indexEntry, perShard*indexWays)
	}
	return x
}

// Capacity is how many blocks the index holds at most.
func (x *Index) Capacity() int { return x.capacity }

// Bytes is the memory the index holds, all of it allocated at creation.
func (x *Index) Bytes() int {
	return int(unsafe.Sizeof(*x)) + x.capacity*int(unsafe.Sizeof(indexEntry{}))
}

// Len counts the blocks held, for tests and metrics; it takes every lock.
func (x *Index) Len() int {
	n := 0
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for j := range sh.entries {
			if sh.entries[j].key != 0 {
				n++
			}
		}
		sh.mu.RUnlock()
	}
	return n
}

// Evicted counts the blocks pushed out to make room since creation: an
// index that evicts blocks younger than the prefixes worth keeping is too
// small (a metric for the operator, who sizes it).
func (x *Index) Evicted() uint64 {
	var n uint64
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		n += sh.evicted
		sh.mu.RUnlock()
	}
	return n
}

// ClusterID is the id the index keeps for a cluster name; never 0.
func ClusterID(name string) uint32 {
	// FNV-1a, inline so that it does not allocate.
	id := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		id ^= uint32(name[i])
		id *= 16777619
	}
	return max(id, 1)
}

func (x *Index) locate(key uint64) (*indexShard, []indexEntry) {
	sh := &x.shards[key%indexShards]
	set := (key / indexShards) % sh.sets
	return sh, sh.entries[set*indexWays : (set+1)*indexWays]
}

// Record notes that cluster served a request of these blocks.
func (x *Index) Record(blocks []uint64, cluster uint32) {
	for _, key := range blocks {
		if key == 0 || cluster == 0 {
			continue
		}
		sh, set := x.locate(key)
		sh.mu.Lock()
		sh.clock++
		e := victim(set, key, sh.clock)
		if e.key != key {
			if e.key != 0 {
				sh.evicted++
			}
			*e = indexEntry{key: key}
		}
		e.used = sh.clock
		// Move (or add) the cluster to the front.
		i := 0
		for i < indexClusters-1 && e.clusters[i] != cluster && e.clusters[i] != 0 {
			i++
		}
		copy(e.clusters[1:i+1], e.clusters[:i])
		e.clusters[0] = cluster
		sh.mu.Unlock()
	}
}

// victim returns the entry of key in its set, else a free entry, else the
// one recorded least recently (by clock distance, so wrapping is harmless).
func victim(set []indexEntry, key uint64, clock uint32) *indexEntry {
	best := &set[0]
	for i := range set {
		e := &set[i]
		switch {
		case e.key == key:
			return e
		case e.key == 0:
			best = e
		case best.key != 0 && clock-e.used > clock-best.used:
			best = e
		}
	}
	return best
}

// Match sets matched[j] to how many leading blocks the index holds for
// cluster ids[j]: its longest cached prefix, in blocks.
func (x *Index) Match(blocks []uint64, ids []uint32, matched []int) {
	for j := range matched {
		matched[j] = 0
	}
	// live are the candidates that hold every block so far: only they can
	// hold the next one, so that past the first block a match costs the
	// few clusters that cached the prefix, not every candidate.
	var liveBuf [16]int
	live := liveBuf[:0]
	for k, key := range blocks {
		sh, set := x.locate(key)
		sh.mu.RLock()
		var e *indexEntry
		for i := range set {
			if set[i].key == key {
				e = &set[i]
				break
			}
		}
		if e != nil && k == 0 {
			for j, id := range ids {
				if e.has(id) {
					matched[j] = 1
					live = append(live, j)
				}
			}
		} else if e != nil {
			n := 0
			for _, j := range live {
				if e.has(ids[j]) {
					matched[j] = k + 1
					live[n] = j
					n++
				}
			}
			live = live[:n]
		}
		sh.mu.RUnlock()
		if e == nil || len(live) == 0 {
			return
		}
	}
}

// HolderClusters is how many clusters Holders finds a block held by at
// most: the clusters the index keeps of a block.
const HolderClusters = indexClusters

// Holders appends to dst the clusters the index keeps for the deepest of
// blocks it holds and for blocks[key-1] (a prompt's leading blocks), each
// once, most recent first: where a pick over many clusters looks for the
// prompt without matching every one. The deepest is found by bisection,
// as the blocks a prompt shares with what was served are a leading run.
func (x *Index) Holders(blocks []uint64, key int, dst []uint32) []uint32 {
	// The deepest held: the last k for which blocks[k] is held, of the
	// run that starts at the first block.
	lo, hi := 0, len(blocks) // blocks[:lo] held as far as bisection knows
	for lo < hi {
		mid := lo + (hi-lo)/2
		if _, ok := x.entry(blocks[mid]); ok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo > 0 {
		dst = x.appendHolders(dst, blocks[lo-1])
	}
	if key > 0 && key <= len(blocks) && key != lo {
		dst = x.appendHolders(dst, blocks[key-1])
	}
	return dst
}

// appendHolders appends to dst the clusters holding block that dst does
// not have.
func (x *Index) appendHolders(dst []uint32, block uint64) []uint32 {
	e, _ := x.entry(block)
	for _, c := range e.clusters {
		if c != 0 && !slices.Contains(dst, c) {
			dst = append(dst, c)
		}
	}
	return dst
}

// entry is a copy of the entry of block key; false when not held.
func (x *Index) entry(key uint64) (indexEntry, bool) {
	sh, set := x.locate(key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	for i := range set {
		if set[i].key == key {
			return set[i], true
		}
	}
	return indexEntry{}, false
}

func (e *indexEntry) has(id uint32) bool {
	for _, c := range e.clusters {
		if c == id {
			return true
		}
	}
	return false
}
