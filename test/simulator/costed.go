package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// costedCompletion serves a completion request under the cost model: the
// round trip, a place in the batch, the prefill of the uncached prompt
// tokens, then the output tokens one decode step each, streamed in chunks
// when the request asks for a stream.
func (s *Server) costedCompletion(w http.ResponseWriter, r *http.Request, k kind, req *completionRequest, adapter string) {
	cm := s.opts.CostModel
	ctx := r.Context()
	if !sleep(ctx, cm.RoundTrip) {
		return
	}
	tokens := req.tokens()
	hashes := BlockHashes(tokens, cm.BlockTokens)
	outputTokens := cm.OutputTokens
	if req.MaxTokens != nil {
		outputTokens = *req.MaxTokens
	}

	release, err := s.engine.acquire(ctx, adapter)
	if err != nil {
		return // the client went away while waiting
	}
	defer release()
	cached := s.cache.admit(hashes, len(tokens), cm.BlockTokens)
	t := cm.charge(len(tokens), cached*cm.BlockTokens)
	// The request's KV blocks: its prompt's and its answer's.
	blocks := int64((len(tokens) + outputTokens + cm.BlockTokens - 1) / cm.BlockTokens)
	s.kvBlocks.Add(blocks)
	defer s.kvBlocks.Add(-blocks)
	if !sleep(ctx, t.firstToken) {
		return
	}

	n := s.requests.Add(1)
	words := answerWords(n, req.Model, s.opts.InstanceID, outputTokens)
	u := &usage{
		PromptTokens: len(tokens), CompletionTokens: outputTokens, TotalTokens: len(tokens) + outputTokens,
		PromptTokensDetails: &promptTokensDetails{CachedTokens: t.cachedTokens},
	}
	if !req.Stream {
		if !sleep(ctx, time.Duration(outputTokens-1)*t.perToken) {
			return
		}
		resp := s.newResponse(k, n, req.Model, strings.Join(words, " "))
		resp.Usage = u
		writeJSON(w, http.StatusOK, resp)
		return
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	// The first token goes out alone at once, so that the client sees
	// it at the time to first token; the others, a decode step each, go
	// in chunks.
	for start, end := 0, 1; start < len(words); start, end = end, min(end+cm.StreamChunkTokens, len(words)) {
		if start > 0 && !sleep(ctx, time.Duration(end-start)*t.perToken) {
			return
		}
		text := strings.Join(words[start:end], " ")
		if start > 0 {
			text = " " + text
		}
		chunk := s.newResponse(k, n, req.Model, text)
		if end < len(words) {
			chunk.Choices[0].FinishReason = ""
		}
		writeEvent(w, k, chunk)
		if flusher != nil {
			flusher.Flush()
		}
	}
	last := s.newResponse(k, n, req.Model, "")
	last.Choices = []choice{}
	last.Usage = u
	writeEvent(w, k, last)
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// writeEvent writes one server-sent event of a stream; a chat chunk
// carries its message as a delta.
func writeEvent(w http.ResponseWriter, k kind, chunk response) {
	if k == chatCompletion {
		chunk.Object = "chat.completion.chunk"
		if len(chunk.Choices) > 0 {
			c := chunk.Choices[0]
			chunk.Choices = []choice{{Delta: c.Message, FinishReason: c.FinishReason}}
		}
	}
	b, _ := json.Marshal(chunk)
	_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
}

// answerWords is an answer of n tokens that names the request and the
// instance.
func answerWords(n uint64, model, instance string, tokens int) []string {
	words := strings.Fields(fmt.Sprintf("Simulated answer %d of %s from instance %s.", n, model, instance))
	for i := 0; len(words) < tokens; i++ {
		words = append(words, fmt.Sprintf("token-%d", i))
	}
	return words[:tokens]
}

// sleep waits d, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// prefixMatch answers how many of a completion request's prompt tokens the
// prefix cache holds now, without changing it: what an oracle router asks
// every server.
func (s *Server) prefixMatch(w http.ResponseWriter, r *http.Request) {
	if s.cache == nil {
		writeError(w, http.StatusBadRequest, "instance %s runs without a cost model: it has no prefix cache", s.opts.InstanceID)
		return
	}
	var req completionRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body is not a valid JSON request: %v", err)
		return
	}
	tokens := req.tokens()
	blocks := s.cache.match(BlockHashes(tokens, s.opts.CostModel.BlockTokens))
	writeJSON(w, http.StatusOK, PrefixMatch{PromptTokens: len(tokens), CachedTokens: min(blocks*s.opts.CostModel.BlockTokens, len(tokens))})
}

// PrefixMatch is the answer of POST /admin/prefix-match.
type PrefixMatch struct {
	PromptTokens int `json:"promptTokens"`
	CachedTokens int `json:"cachedTokens"`
}

// CacheStats returns the prefix cache's counters; ok is false without a
// cost model.
func (s *Server) CacheStats() (stats CacheStats, ok bool) {
	if s.cache == nil {
		return CacheStats{}, false
	}
	return s.cache.stats(), true
}

func (s *Server) cacheAdmin(w http.ResponseWriter, r *http.Request) {
	if s.cache == nil {
		writeError(w, http.StatusBadRequest, "instance %s runs without a cost model: it has no prefix cache", s.opts.InstanceID)
		return
	}
	if r.Method == http.MethodDelete {
		s.cache.reset()
	}
	writeJSON(w, http.StatusOK, s.cache.stats())
}
