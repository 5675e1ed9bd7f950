package simulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxRequestBytes bounds a completion request body.
const maxRequestBytes = 4 << 20

type kind int

const (
	textCompletion kind = iota
	chatCompletion
)

// completionRequest is the part of an OpenAI request the simulator reads.
type completionRequest struct {
	Model     string          `json:"model"`
	Stream    bool            `json:"stream"`
	MaxTokens *int            `json:"max_tokens"`
	Prompt    json.RawMessage `json:"prompt"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (s *Server) completion(k kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.applyFault(r.Context(), w) {
			return
		}
		var req completionRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes))
		if err := dec.Decode(&req); err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeError(w, http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxRequestBytes)
				return
			}
			writeError(w, http.StatusBadRequest, "request body is not a valid JSON request: %v", err)
			return
		}
		if req.Model == "" {
			writeError(w, http.StatusBadRequest, "the request names no model")
			return
		}
		adapter := ""
		if req.Model != s.opts.Model {
			if !s.adapters[req.Model] {
				writeError(w, http.StatusNotFound, "the model `%s` does not exist on instance %s", req.Model, s.opts.InstanceID)
				return
			}
			adapter = req.Model
		}
		if s.opts.CostModel != nil {
			if req.MaxTokens != nil && (*req.MaxTokens < 1 || *req.MaxTokens > maxOutputTokens) {
				writeError(w, http.StatusBadRequest, "max_tokens %d is not between 1 and %d", *req.MaxTokens, maxOutputTokens)
				return
			}
			s.costedCompletion(w, r, k, &req, adapter)
			return
		}
		latency := s.opts.Latency
		if v := r.Header.Get(LatencyHeader); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > MaxRequestLatency {
				writeError(w, http.StatusBadRequest, "header %s: %q is not a duration between 0 and %s", LatencyHeader, v, MaxRequestLatency)
				return
			}
			latency = d
		}

		release, err := s.engine.acquire(r.Context(), adapter)
		if err != nil {
			return // the client went away while waiting
		}
		timer := time.NewTimer(latency)
		select {
		case <-timer.C:
		case <-r.Context().Done():
		}
		timer.Stop()
		release()
		if r.Context().Err() != nil {
			return
		}

		n := s.requests.Add(1)
		text := fmt.Sprintf("Simulated answer %d of %s from instance %s.", n, req.Model, s.opts.InstanceID)
		promptTokens := len(req.tokens())
		resp := s.newResponse(k, n, req.Model, text)
		completionTokens := len(strings.Fields(text))
		usage := &usage{PromptTokens: promptTokens, CompletionTokens: completionTokens, TotalTokens: promptTokens + completionTokens}

		if req.Stream {
			writeStream(w, k, resp, usage)
			return
		}
		resp.Usage = usage
		writeJSON(w, http.StatusOK, resp)
	}
}

// newResponse is the n-th answer of the server, with text as its only
// choice.
func (s *Server) newResponse(k kind, n uint64, model, text string) response {
	resp := response{
		Created:  time.Now().Unix(),
		Model:    model,
		Instance: s.opts.InstanceID,
	}
	switch k {
	case textCompletion:
		resp.ID = "cmpl-" + s.opts.InstanceID + "-" + strconv.FormatUint(n, 10)
		resp.Object = "text_completion"
		resp.Choices = []choice{{Text: &text, FinishReason: "stop"}}
	case chatCompletion:
		resp.ID = "chatcmpl-" + s.opts.InstanceID + "-" + strconv.FormatUint(n, 10)
		resp.Object = "chat.completion"
		resp.Choices = []choice{{Message: &message{Role: "assistant", Content: text}, FinishReason: "stop"}}
	}
	return resp
}

// response is an OpenAI completion or chat completion, with Instance added:
// the ID of the instance that served it.
type response struct {
	ID       string   `json:"id"`
	Object   string   `json:"object"`
	Created  int64    `json:"created"`
	Model    string   `json:"model"`
	Choices  []choice `json:"choices"`
	Usage    *usage   `json:"usage,omitempty"`
	Instance string   `json:"instance"`
}

type choice struct {
	Index        int      `json:"index"`
	Text         *string  `json:"text,omitempty"`
	Message      *message `json:"message,omitempty"`
	Delta        *message `json:"delta,omitempty"`
	FinishReason string   `json:"finish_reason"`
}

type message struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails says, under a cost model, how many prompt tokens
	// the prefix cache served (OpenAI's and vLLM's field).
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// writeStream answers as server-sent events, as OpenAI and vLLM do for
// "stream": true: the whole answer in one chunk, the usage in a last one,
// then [DONE].
func writeStream(w http.ResponseWriter, k kind, resp response, u *usage) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	if k == chatCompletion {
		resp.Object = "chat.completion.chunk"
		c := resp.Choices[0]
		resp.Choices = []choice{{Delta: c.Message, FinishReason: c.FinishReason}}
	}
	last := resp
	last.Choices = []choice{}
	last.Usage = u
	for _, chunk := range []response{resp, last} {
		b, _ := json.Marshal(chunk)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// tokens are the request's prompt tokens: those of its prompt, then of its
// messages' contents in order.
func (r *completionRequest) tokens() []string {
	out := appendTokens(nil, r.Prompt)
	for _, m := range r.Messages {
		out = appendTokens(out, m.Content)
	}
	return out
}

// appendTokens approximates the tokens of a prompt (a string, a list of
// strings, or chat content parts) by its words, a token ID standing for
// itself.
func appendTokens(out []string, raw json.RawMessage) []string {
	if len(raw) == 0 {
		return out
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return out
	}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			out = append(out, strings.Fields(v)...)
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			walk(v["text"])
		case float64:
			out = append(out, strconv.FormatFloat(v, 'g', -1, 64)) // a token ID
		}
	}
	walk(v)
	return out
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root"`
	Parent  string `json:"parent,omitempty"`
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	now := time.Now().Unix()
	data := []model{{ID: s.opts.Model, Object: "model", Created: now, OwnedBy: "mci-simulator", Root: s.opts.Model}}
	for _, a := range s.opts.LoRAAdapters {
		data = append(data, model{ID: a, Object: "model", Created: now, OwnedBy: "mci-simulator", Root: a, Parent: s.opts.Model})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *Server) adminReady(w http.ResponseWriter, r *http.Request) {
	ready, err := strconv.ParseBool(r.URL.Query().Get("ready"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "query parameter ready must be true or false")
		return
	}
	s.SetReady(ready)
	writeJSON(w, http.StatusOK, map[string]any{"instance": s.opts.InstanceID, "ready": ready})
}

func (s *Server) getPins(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Pins())
}

// setPins replaces the pins with the JSON body; {} unpins everything.
func (s *Server) setPins(w http.ResponseWriter, r *http.Request) {
	var p Pins
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		writeError(w, http.StatusBadRequest, "pins: %v", err)
		return
	}
	if err := s.SetPins(p); err != nil {
		writeError(w, http.StatusBadRequest, "pins: %v", err)
		return
	}
	writeJSON(w, http.StatusOK, s.Pins())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// writeError answers an OpenAI-style error.
func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	typ := "invalid_request_error"
	if code == http.StatusNotFound {
		typ = "not_found_error"
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{
		"message": fmt.Sprintf(format, args...),
		"type":    typ,
		"code":    code,
	}})
}
