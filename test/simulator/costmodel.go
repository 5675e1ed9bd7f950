package simulator

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"
)

// CostModel makes a simulated request cost what it would cost a vLLM
// server with automatic prefix caching, so that where a request is routed
// shows in its time to first token (TTFT). Without one (the default) a
// request simply runs for Options.Latency.
//
// The model, as vLLM and llm-d-inference-sim describe theirs (learnt from
// their documentation, not copied): the prompt is cut into blocks of
// BlockTokens tokens, each block named by a hash chained over the blocks
// before it, so that a block matches only with its whole prefix; full
// blocks of a prompt are kept in a per-server cache of CacheBlocks blocks,
// evicting the least recently used. A request waits for a place in the
// batch (Options.Concurrency), then its first token comes after
//
//	TTFT = queueing + Base + PrefillPerToken × (prompt tokens − cached tokens)
//
// and each further output token after DecodePerToken; it holds its place
// in the batch until its last token. Tokens are the simulator's usage
// tokens: the words of the prompt (or of the messages' contents, in order).
// RoundTrip is added once before the response starts: the network delay of
// a model server in a remote cluster, so that every path to it (through a
// sidecar or straight through its cluster's EPP) pays it.
type CostModel struct {
	BlockTokens     int
	CacheBlocks     int
	Base            time.Duration
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// OutputTokens is the answer's length when the request sets no
	// max_tokens.
	OutputTokens int
	// StreamChunkTokens is how many tokens each streamed chunk carries.
	StreamChunkTokens int
	RoundTrip         time.Duration
}

// Defaults of the zero fields of an enabled CostModel.
const (
	DefaultBlockTokens       = 16
	DefaultCacheBlocks       = 4096
	DefaultOutputTokens      = 16
	DefaultStreamChunkTokens = 4
	// maxOutputTokens bounds max_tokens, so that no request holds the
	// batch for long.
	maxOutputTokens = 4096
)

func (c *CostModel) complete() error {
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.CacheBlocks == 0 {
		c.CacheBlocks = DefaultCacheBlocks
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = DefaultOutputTokens
	}
	if c.StreamChunkTokens == 0 {
		c.StreamChunkTokens = DefaultStreamChunkTokens
	}
	var errs []error
	for name, v := range map[string]int{"block tokens": c.BlockTokens, "cache blocks": c.CacheBlocks, "output tokens": c.OutputTokens, "stream chunk tokens": c.StreamChunkTokens} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("cost model %s %d is negative", name, v))
		}
	}
	for name, v := range map[string]time.Duration{"base": c.Base, "prefill per token": c.PrefillPerToken, "decode per token": c.DecodePerToken, "round trip": c.RoundTrip} {
		if v < 0 || v > MaxRequestLatency {
			errs = append(errs, fmt.Errorf("cost model %s %s is not between 0 and %s", name, v, MaxRequestLatency))
		}
	}
	return errors.Join(errs...)
}

// BlockHashes are the chained hashes of the full blocks of tokens: the
// i-th names the first (i+1)×blockTokens tokens.
func BlockHashes(tokens []string, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	out := make([]uint64, 0, len(tokens)/blockTokens)
	var prev [8]byte
	for start := 0; start+blockTokens <= len(tokens); start += blockTokens {
		h := fnv.New64a()
		_, _ = h.Write(prev[:])
		for _, t := range tokens[start : start+blockTokens] {
			_, _ = h.Write([]byte(t))
			_, _ = h.Write([]byte{0})
		}
		sum := h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], sum)
		out = append(out, sum)
	}
	return out
}

// prefixCache is a bounded LRU of block hashes, with the counters vLLM
// reports for it.
type prefixCache struct {
	capacity int

	mu      sync.Mutex
	order   *list.List // front: most recently used
	blocks  map[uint64]*list.Element
	queries uint64 // prompt tokens looked up
	hits    uint64 // of them, tokens found cached
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, order: list.New(), blocks: map[uint64]*list.Element{}}
}

// match counts the leading blocks of hashes that are cached, without
// touching them.
func (c *prefixCache) match(hashes []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.matchLocked(hashes)
}

func (c *prefixCache) matchLocked(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := c.blocks[h]; !ok {
			break
		}
		n++
	}
	return n
}

// admit looks a prompt of promptTokens tokens up (counting the query and
// its hits), then caches all its full blocks as most recently used,
// evicting the least recently used beyond capacity. It returns the number
// of cached blocks found.
func (c *prefixCache) admit(hashes []uint64, promptTokens, blockTokens int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.matchLocked(hashes)
	c.queries += uint64(promptTokens)
	c.hits += uint64(min(n*blockTokens, promptTokens))
	for _, h := range hashes {
		if e, ok := c.blocks[h]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.blocks[h] = c.order.PushFront(h)
	}
	for c.order.Len() > c.capacity {
		e := c.order.Back()
		delete(c.blocks, e.Value.(uint64))
		c.order.Remove(e)
	}
	return n
}

// reset empties the cache; the counters keep counting.
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	clear(c.blocks)
}

// CacheStats are the prefix cache's counters and size.
type CacheStats struct {
	// QueryTokens and HitTokens count prompt tokens looked up and found
	// cached since the server started (vLLM's prefix_cache_queries and
	// prefix_cache_hits).
	QueryTokens uint64 `json:"queryTokens"`
	HitTokens   uint64 `json:"hitTokens"`
	Blocks      int    `json:"blocks"`
	Capacity    int    `json:"capacity"`
}

func (c *prefixCache) stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{QueryTokens: c.queries, HitTokens: c.hits, Blocks: c.order.Len(), Capacity: c.capacity}
}

// timing is what the cost model charges one admitted request.
type timing struct {
	cachedTokens int
	// firstToken is the time from admission to the first token.
	firstToken time.Duration
	// perToken is the time of each further output token.
	perToken time.Duration
}

func (c *CostModel) charge(promptTokens, cachedTokens int) timing {
	cachedTokens = min(cachedTokens, promptTokens)
	return timing{
		cachedTokens: cachedTokens,
		firstToken:   c.Base + time.Duration(promptTokens-cachedTokens)*c.PrefillPerToken,
		perToken:     c.DecodePerToken,
	}
}
