package requestmodel

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	completion = `{"model":"llama2","prompt":"Say hello","max_tokens":16,"temperature":0}`
	chat       = `{
  "model": "llama2",
  "messages": [
    {"role": "system", "content": "You are terse. The model field below is not the model.", "model": "nested"},
    {"role": "user", "content": "Say \"hello\" <b>& bye</b>"}
  ],
  "stream": true
}`
)

func TestParseBody(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantModel string
		wantErr   error
	}{
		{name: "a completions request", body: completion, wantModel: "llama2"},
		{name: "a chat completions request, the model of a nested object is not the request's", body: chat, wantModel: "llama2"},
		{name: "whitespace around the colon", body: "{ \"model\" :\n \"m\" }", wantModel: "m"},
		{name: "an escaped key is the same key", body: `{"mod\u0065l":"m"}`, wantModel: "m"},
		{name: "an escaped model name is unescaped", body: `{"model":"a\/b\u00e9"}`, wantModel: "a/bé"},
		{name: "of a key given twice the last counts, as in JSON decoders", body: `{"model":"first","model":"second"}`, wantModel: "second"},
		{name: "the model after other members", body: `{"prompt":[1,2,{"x":null}],"n":1,"model":"m"}`, wantModel: "m"},
		{name: "keys are case-sensitive", body: `{"Model":"m"}`, wantErr: ErrNoModel},
		{name: "no model", body: `{"prompt":"hi"}`, wantErr: ErrNoModel},
		{name: "an empty model", body: `{"model":""}`, wantErr: ErrNoModel},
		{name: "a null model", body: `{"model":null}`, wantErr: ErrNoModel},
		{name: "a number is not a model", body: `{"model":7}`, wantErr: ErrNoModel},
		{name: "an empty body", body: ``, wantErr: ErrNotJSON},
		{name: "plain text", body: `model=llama2`, wantErr: ErrNotJSON},
		{name: "a JSON array", body: `[{"model":"m"}]`, wantErr: ErrNotJSON},
		{name: "a JSON string", body: `"model"`, wantErr: ErrNotJSON},
		{name: "truncated JSON", body: `{"model":"m","prompt":"hel`, wantErr: ErrNotJSON},
		{name: "invalid JSON after the model", body: `{"model":"m","prompt":nope}`, wantErr: ErrNotJSON},
		{name: "data after the object", body: `{"model":"m"} {"model":"n"}`, wantErr: ErrNotJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBody([]byte(tt.body))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantModel, b.Model())
		})
	}
}

func TestBodyWithModel(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		model string
		want  string
	}{
		{
			name:  "a completions request keeps everything but the model",
			body:  completion,
			model: "vllm-llama2-7b-2024-11-20",
			want:  `{"model":"vllm-llama2-7b-2024-11-20","prompt":"Say hello","max_tokens":16,"temperature":0}`,
		},
		{
			name:  "a longer name with characters JSON escapes",
			body:  `{"model" : "a", "x": 1}`,
			model: `q"u<o>te`,
			want:  `{"model" : "q\"u\u003co\u003ete", "x": 1}`,
		},
		{
			name:  "every occurrence of a repeated key is rewritten",
			body:  `{"model":"a","model":"b"}`,
			model: "c",
			want:  `{"model":"c","model":"c"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBody([]byte(tt.body))
			require.NoError(t, err)
			got := b.WithModel(tt.model)
			assert.Equal(t, tt.want, string(got))
			again, err := ParseBody(got)
			require.NoError(t, err)
			assert.Equal(t, tt.model, again.Model())
		})
	}

	t.Run("a chat completions request keeps its messages byte for byte", func(t *testing.T) {
		b, err := ParseBody([]byte(chat))
		require.NoError(t, err)
		got := b.WithModel("lora-x")
		var before, after map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(chat), &before))
		require.NoError(t, json.Unmarshal(got, &after))
		assert.Equal(t, `"lora-x"`, string(after["model"]))
		assert.Equal(t, string(before["messages"]), string(after["messages"]))
		assert.Equal(t, string(before["stream"]), string(after["stream"]))
	})

	t.Run("the same model returns the parsed bytes", func(t *testing.T) {
		raw := []byte(completion)
		b, err := ParseBody(raw)
		require.NoError(t, err)
		assert.Same(t, &raw[0], &b.WithModel("llama2")[0])
	})
}

func BenchmarkParseBody(b *testing.B) {
	body := benchBody(4 << 10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseBody(body); err != nil {
			b.Fatal(err)
		}
	}
}

// referenceModel is the model as a model server reads it: the body decoded
// into a map (exact keys, the last of a repeated key), "model" a string.
func referenceModel(raw []byte) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", ErrNotJSON
	}
	v, ok := m["model"]
	if !ok {
		return "", ErrNoModel
	}
	var model string
	if err := json.Unmarshal(v, &model); err != nil || model == "" {
		return "", ErrNoModel
	}
	return model, nil
}

// FuzzParseBody checks ParseBody, whose walk trusts json.Valid, against
// decoding into a map, and that a rewrite is read back.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{completion, chat, `{"model":"a","model":"b"}`, `{"mod\u0065l":"m"}`, `{"a":"\\\"","model":"x\\"}`, `[1]`, `{"model":1}`, ` {"x":[{"y":"]}"}],"model":"m"} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantErr := referenceModel(raw)
		b, err := ParseBody(raw)
		if wantErr != nil {
			// An object with a non-string "model" fails the reference's map
			// decoding the same way; only the class of error must agree.
			require.Error(t, err)
			if errors.Is(wantErr, ErrNoModel) {
				require.ErrorIs(t, err, ErrNoModel)
			}
			return
		}
		require.NoError(t, err)
		require.Equal(t, want, b.Model())
		rewritten, err := ParseBody(b.WithModel("rewritten/" + want))
		require.NoError(t, err)
		require.Equal(t, "rewritten/"+want, rewritten.Model())
	})
}

// benchBody returns a chat completions body of about size bytes.
func benchBody(size int) []byte {
	const head = `{"model":"chat","messages":[{"role":"user","content":"`
	const tail = `"}],"max_tokens":128,"stream":false}`
	return []byte(head + strings.Repeat("a", max(size-len(head)-len(tail), 0)) + tail)
}
