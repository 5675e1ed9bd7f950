package simulator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func words(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func TestBlockHashesChainThePrefix(t *testing.T) {
	shared := words("s", 32)
	a := BlockHashes(append(append([]string{}, shared...), words("a", 20)...), 16)
	b := BlockHashes(append(append([]string{}, shared...), words("b", 20)...), 16)
	// The same block text after a different prefix is another block.
	shifted := BlockHashes(append(words("x", 16), shared[16:32]...), 16)
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"full blocks only", len(a), 3},
		{"shared blocks match", a[:2], b[:2]},
		{"diverging blocks differ", a[2] == b[2], false},
		{"a block matches only with its prefix", shifted[1] == a[1], false},
		{"a prompt shorter than a block has none", len(BlockHashes(words("s", 15), 16)), 0},
		{"no block size, no blocks", len(BlockHashes(shared, 0)), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.got) })
	}
}

func TestPrefixCacheIsABoundedLRU(t *testing.T) {
	c := newPrefixCache(3)
	assert.Equal(t, 0, c.admit([]uint64{1, 2}, 40, 16))
	assert.Equal(t, 2, c.admit([]uint64{1, 2}, 40, 16), "the same prompt again")
	assert.Equal(t, 2, c.admit([]uint64{1, 2, 3, 4}, 70, 16), "evicts the oldest block beyond 3")
	assert.Equal(t, 0, c.match([]uint64{1}), "block 1 was the least recently used")
	assert.Equal(t, 3, c.match([]uint64{2, 3, 4}))
	assert.Equal(t, CacheStats{QueryTokens: 150, HitTokens: 64, Blocks: 3, Capacity: 3}, c.stats())
	c.reset()
	assert.Equal(t, 0, c.match([]uint64{2}))
	assert.Equal(t, uint64(64), c.stats().HitTokens, "counters survive a reset")
}

func TestNewRejectsBadCostModels(t *testing.T) {
	for _, cm := range []CostModel{
		{BlockTokens: -1},
		{CacheBlocks: -5},
		{PrefillPerToken: -time.Millisecond},
		{RoundTrip: time.Hour},
	} {
		t.Run(fmt.Sprintf("%+v", cm), func(t *testing.T) {
			_, err := New(Options{Model: base, InstanceID: "x", CostModel: &cm})
			assert.Error(t, err)
		})
	}
}

// costed is one request's outcome: its time to the first streamed chunk,
// its chunks and its usage.
type costed struct {
	ttft   time.Duration
	chunks int
	text   string
	usage  usage
}

func streamCompletion(t *testing.T, url, prompt string, maxTokens int) costed {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": base, "prompt": prompt, "max_tokens": maxTokens, "stream": true})
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out costed
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk response
		require.NoError(t, json.Unmarshal([]byte(data), &chunk))
		if chunk.Usage != nil {
			out.usage = *chunk.Usage
			continue
		}
		if out.chunks == 0 {
			out.ttft = time.Since(start)
		}
		out.chunks++
		out.text += *chunk.Choices[0].Text
	}
	require.NoError(t, sc.Err())
	return out
}

func TestCostModelChargesUncachedPrefill(t *testing.T) {
	cm := &CostModel{BlockTokens: 16, CacheBlocks: 64, Base: 5 * time.Millisecond, PrefillPerToken: time.Millisecond,
		DecodePerToken: 2 * time.Millisecond, StreamChunkTokens: 4}
	s, srv := start(t, Options{CostModel: cm})
	prompt := strings.Join(words("w", 200), " ")

	cold := streamCompletion(t, srv.URL, prompt, 10)
	warm := streamCompletion(t, srv.URL, prompt+" and one more question", 10)

	assert.Equal(t, 200, cold.usage.PromptTokens)
	assert.Equal(t, 0, cold.usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, 192, warm.usage.PromptTokensDetails.CachedTokens, "12 full blocks of the first prompt")
	assert.Equal(t, 10, warm.usage.CompletionTokens)
	assert.Len(t, strings.Fields(warm.text), 10)
	assert.Equal(t, 4, warm.chunks, "the first token alone, then 9 in chunks of 4")
	// Cold: 5 ms + 200 × 1 ms = 205 ms; warm: 5 ms + 12 × 1 ms = 17 ms.
	assert.GreaterOrEqual(t, cold.ttft, 205*time.Millisecond)
	assert.Less(t, warm.ttft, cold.ttft, "the cached prefix is not prefilled again")

	st, ok := s.CacheStats()
	require.True(t, ok)
	assert.Equal(t, uint64(200+204), st.QueryTokens)
	assert.Equal(t, uint64(192), st.HitTokens)

	m := metricsOf(t, srv.URL)
	assert.Equal(t, 404.0, m.Value(t, `vllm:prefix_cache_queries_total{model_name="`+base+`"}`))
	assert.Equal(t, 192.0, m.Value(t, `vllm:prefix_cache_hits_total{model_name="`+base+`"}`))

	var match PrefixMatch
	getJSON(t, http.MethodPost, srv.URL+"/admin/prefix-match", `{"model":"x","prompt":"`+prompt+`"}`, &match)
	assert.Equal(t, PrefixMatch{PromptTokens: 200, CachedTokens: 192}, match)
	getJSON(t, http.MethodDelete, srv.URL+"/admin/cache", "", &st)
	assert.Equal(t, 0, st.Blocks)
	getJSON(t, http.MethodPost, srv.URL+"/admin/prefix-match", `{"model":"x","prompt":"`+prompt+`"}`, &match)
	assert.Equal(t, 0, match.CachedTokens, "the cache was emptied")
}

func TestCostModelQueuesBeyondTheBatch(t *testing.T) {
	// Each request runs for a second: the state looked for (two run, one
	// waits) lasts until the first ends, long enough to be seen on a busy
	// machine, where the three requests may start a few hundred ms apart.
	cm := &CostModel{Base: time.Second, CacheBlocks: 100}
	s, srv := start(t, Options{CostModel: cm, Concurrency: 2})
	var wg sync.WaitGroup
	ttfts := make([]time.Duration, 3)
	for i := range ttfts {
		wg.Go(func() { ttfts[i] = streamCompletion(t, srv.URL, fmt.Sprintf("request %d", i), 1).ttft })
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL + "/admin/load")
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		var m Metrics
		return json.NewDecoder(resp.Body).Decode(&m) == nil && m.Running == 2 && m.Waiting == 1 && m.KVCacheUsage > 0
	}, 2*time.Second, 5*time.Millisecond, "two run, one waits")
	wg.Wait()
	slowest := max(ttfts[0], ttfts[1], ttfts[2])
	assert.GreaterOrEqual(t, slowest, 2*time.Second, "the third waited for a place: %v", ttfts)
	assert.Equal(t, 0, s.Metrics().Running)
	assert.Zero(t, s.Metrics().KVCacheUsage)
}

func TestCostModelNonStreamingAndErrors(t *testing.T) {
	cm := &CostModel{RoundTrip: 30 * time.Millisecond, DecodePerToken: time.Millisecond}
	_, srv := start(t, Options{CostModel: cm})
	tests := []struct {
		name     string
		body     string
		code     int
		minTime  time.Duration
		contains string
	}{
		{"answer of max_tokens", `{"model":"` + base + `","prompt":"hi","max_tokens":20}`, http.StatusOK, 30*time.Millisecond + 19*time.Millisecond, `"completion_tokens":20`},
		{"default length", `{"model":"` + base + `","messages":[{"role":"user","content":"hi there"}]}`, http.StatusOK, 30 * time.Millisecond, `"prompt_tokens":2,"completion_tokens":16`},
		{"max_tokens 0", `{"model":"` + base + `","prompt":"hi","max_tokens":0}`, http.StatusBadRequest, 0, "max_tokens 0"},
		{"max_tokens too large", `{"model":"` + base + `","prompt":"hi","max_tokens":100000}`, http.StatusBadRequest, 0, "max_tokens 100000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := "/v1/completions"
			if strings.Contains(tt.body, "messages") {
				path = "/v1/chat/completions"
			}
			begin := time.Now()
			resp, b := post(t, context.Background(), srv.URL+path, tt.body)
			assert.Equal(t, tt.code, resp.StatusCode, "%s", b)
			assert.GreaterOrEqual(t, time.Since(begin), tt.minTime)
			assert.Contains(t, string(b), tt.contains)
		})
	}
}

func TestNoCostModelNoCache(t *testing.T) {
	s, srv := start(t, Options{})
	_, ok := s.CacheStats()
	assert.False(t, ok)
	resp, b := post(t, context.Background(), srv.URL+"/admin/prefix-match", `{"prompt":"x"}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(b), "without a cost model")
	m := metricsOf(t, srv.URL)
	for name := range m {
		assert.NotContains(t, name, "prefix_cache")
	}
}

func getJSON(t *testing.T, method, url, body string, into any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(into))
}
