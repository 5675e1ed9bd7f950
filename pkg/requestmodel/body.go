package requestmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mci-dev/mci/pkg/jsonscan"
	"github.com/mci-dev/mci/pkg/promptprefix"
)

// DefaultMaxRequestBodyBytes bounds a request body the EPP, or the sidecar
// before it, buffers: far above a chat request with a long context, low
// enough that a handful of huge requests cannot exhaust its memory.
const DefaultMaxRequestBodyBytes = 8 << 20

var (
	// ErrNotJSON means the request body is not a JSON object. The EPP
	// answers 400.
	ErrNotJSON = errors.New("request body is not a JSON object")
	// ErrNoModel means the body has no top-level "model" string. The EPP
	// answers 400.
	ErrNoModel = errors.New(`request body has no "model" string`)
)

// Body is an OpenAI-style request body (completions, chat completions, and
// any other JSON object with a top-level "model"), parsed just enough to read
// and rewrite its model.
type Body struct {
	raw   []byte
	model string
	// spans are the byte ranges of the "model" values in raw. JSON allows a
	// key twice; decoders keep the last value, which is the one Model
	// returns, and a rewrite replaces them all so no reader sees another.
	spans [][2]int
	// prompt is what makes the prompt, gathered in the same walk.
	prompt promptprefix.Prompt
}

// ParseBody parses raw, which the Body keeps (not copied).
//
// Keys are matched exactly, as the model servers' (Python) JSON decoders do;
// encoding/json's case-insensitive struct matching would read "Model" too.
// Everything but the model is left as it is: a rewrite changes the model
// value's bytes only.
//
// The body is validated with json.Valid, then its top-level members are
// walked without decoding them: a prompt is skipped with a byte search, not
// unmarshaled. This is about three times faster than a json.Decoder walk.
func ParseBody(raw []byte) (*Body, error) {
	b, err := ReadBody(raw)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// ReadBody is ParseBody for a reader that wants the prompt too, model or
// not: on an ErrNoModel error it still returns the Body (its Model "") of
// a body that is a JSON object, for its Prompt. On ErrNotJSON the Body is
// nil.
func ReadBody(raw []byte) (*Body, error) {
	if !json.Valid(raw) {
		// The slow decoder runs on this error path only, for its message.
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNotJSON, err)
		}
		return nil, ErrNotJSON
	}
	i := jsonscan.SkipSpace(raw, 0)
	if raw[i] != '{' {
		return nil, ErrNotJSON
	}
	b := &Body{raw: raw}
	found := false
	var modelErr error
	// raw is valid JSON: every index below stays in bounds and every token
	// is where the grammar puts it.
	for i = jsonscan.SkipSpace(raw, i+1); raw[i] != '}'; {
		keyEnd := jsonscan.StringEnd(raw, i)
		key := raw[i:keyEnd]
		start := jsonscan.SkipSpace(raw, jsonscan.SkipSpace(raw, keyEnd)+1) // past the colon
		end := jsonscan.ValueEnd(raw, start)
		if isModelKey(key) {
			var model string
			if err := json.Unmarshal(raw[start:end], &model); err != nil {
				// The first such error is the one reported; the walk goes
				// on for the prompt.
				if modelErr == nil {
					modelErr = fmt.Errorf(`%w: "model" is %s`, ErrNoModel, raw[start:end])
				}
			} else {
				b.model, found = model, true
				b.spans = append(b.spans, [2]int{start, end})
			}
		}
		b.prompt.Member(key, raw[start:end])
		if i = jsonscan.SkipSpace(raw, end); raw[i] == ',' {
			i = jsonscan.SkipSpace(raw, i+1)
		}
	}
	switch {
	case modelErr != nil:
		b.model, b.spans = "", nil
		return b, modelErr
	case !found || b.model == "":
		b.model, b.spans = "", nil
		return b, ErrNoModel
	}
	return b, nil
}

// isModelKey reports whether a quoted key is "model", escapes resolved.
func isModelKey(key []byte) bool {
	if string(key) == `"model"` {
		return true
	}
	if bytes.IndexByte(key, '\\') < 0 {
		return false
	}
	var k string
	return json.Unmarshal(key, &k) == nil && k == "model"
}

// Prompt returns the members of the body that make its prompt, for
// promptprefix to hash without reading the body again.
func (b *Body) Prompt() *promptprefix.Prompt { return &b.prompt }

// Model returns the body's model.
func (b *Body) Model() string { return b.model }

// WithModel returns the body with its model set to model: a new slice when
// the model changes, the parsed bytes when it does not.
func (b *Body) WithModel(model string) []byte {
	if model == b.model {
		return b.raw
	}
	quoted, err := json.Marshal(model)
	if err != nil {
		// Marshaling a string cannot fail.
		panic(err)
	}
	// Sized from the spans' raw lengths, not the decoded model's: escapes
	// and invalid UTF-8 (decoded as U+FFFD) make the two differ.
	size := len(b.raw)
	for _, s := range b.spans {
		size += len(quoted) - (s[1] - s[0])
	}
	out := make([]byte, 0, size)
	prev := 0
	for _, s := range b.spans {
		out = append(out, b.raw[prev:s[0]]...)
		out = append(out, quoted...)
		prev = s[1]
	}
	return append(out, b.raw[prev:]...)
}
