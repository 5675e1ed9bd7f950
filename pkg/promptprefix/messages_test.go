package promptprefix

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/jsonscan"
)

// promptOf gathers body's prompt as the sidecar's body reader does (its
// top-level members, the body valid JSON), or returns nil for a body that
// is not a JSON object.
func promptOf(body []byte) *Prompt {
	if !json.Valid(body) {
		return nil
	}
	i := jsonscan.SkipSpace(body, 0)
	if body[i] != '{' {
		return nil
	}
	var p Prompt
	for i = jsonscan.SkipSpace(body, i+1); body[i] != '}'; {
		keyEnd := jsonscan.StringEnd(body, i)
		start := jsonscan.SkipSpace(body, jsonscan.SkipSpace(body, keyEnd)+1)
		end := jsonscan.ValueEnd(body, start)
		p.Member(body[i:keyEnd], body[start:end])
		if i = jsonscan.SkipSpace(body, end); body[i] == ',' {
			i = jsonscan.SkipSpace(body, i+1)
		}
	}
	return &p
}

// assertSameBlocks checks that reading body's messages in place gives
// what decoding them gives: the same hashes, or the same error.
func assertSameBlocks(t *testing.T, body []byte) {
	t.Helper()
	p := promptOf(body)
	if p == nil {
		return
	}
	dst := []uint64{7}
	want, wantErr := p.decodeBlocks(dst, "ns/pool")
	got, err := p.Blocks(dst, "ns/pool")
	if wantErr != nil {
		assert.EqualError(t, err, wantErr.Error(), "%s", body)
		return
	}
	require.NoError(t, err, "%s", body)
	assert.Equal(t, want, got, "%s", body)
}

// messageBodies are chat bodies of the shapes clients send, and of those
// the in-place reading leaves to the decoding.
func messageBodies(t testing.TB) [][]byte {
	long := text("You are a helpful assistant.", 1000)
	bodies := [][]byte{
		chatBody(t, long, text("What is", 300)),
		chatBody(t, long, text("What is", 300), text("It is", 400), text("And then", 200)),
		chatBody(t, text("p", (MaxBlocks+10)*BlockBytes), "after the last block"),
		[]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"},{"type":"image_url","image_url":{"url":"x"}}]}]}`),
		[]byte(`{"prompt":"` + long + `","messages":[]}`),
		[]byte(`{"messages":[],"prompt":["` + long + `",12,34]}`),
		[]byte(`{"messages":[]}`),
		[]byte(`{"messages":null,"prompt":"` + long + `"}`),
	}
	for _, m := range []string{
		// Spelled otherwise, laid out otherwise.
		`{"ROLE":"user","Content":"` + long + `"}`,
		` { "role" : "user" , "content" : "` + long + `" , "name" : {"a":[1,"]"]} } `,
		`{"content":"` + long + `"}`,
		`{"role":"user"}`,
		`{}`,
		`{"role":"u\"s\\er","content":"x\"y\\` + long + `"}`,
		`{"role":"\u0075ser","content":"` + long + `"}`,
		`{"role":"üser","content":"` + long + `"}`,
		"{\"role\":\"\xffuser\",\"content\":\"" + long + "\"}",
		`{"role":"user","content":12345}`,
		`{"role":"user","content":{"text":"` + long + `"}}`,
		`{"role":"user","content":[1,"a",{"type":"text","text":"b"},{"type":"text","text":3}]}`,
		// Left to the decoding.
		`{"role":"user","role":"system","content":"` + long + `"}`,
		`{"role":"user","content":"a","CONTENT":"` + long + `"}`,
		`{"role":null,"content":"` + long + `"}`,
		`{"role":"user","content":null}`,
		`{"role":1,"content":"` + long + `"}`,
		`{"r\u006fle":"system","content":"` + long + `"}`,
		`{"rolé":"system","content":"` + long + `"}`,
		`{"role":"user","content":[{"type":1}]}`,
		`null`,
		`"user"`,
		`[{"role":"user"}]`,
	} {
		bodies = append(bodies,
			[]byte(`{"model":"m","messages":[`+m+`]}`),
			[]byte(`{"model":"m","messages":[{"role":"system","content":"`+long+`"},`+m+`,{"role":"user","content":"end"}]}`),
		)
	}
	return append(bodies,
		[]byte(`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"system","content":"`+long+`"}]}`),
		[]byte(`{"messages":{"role":"user"}}`),
		[]byte(`{"messages":"`+long+`"}`),
	)
}

// assertSameContent checks that writing the content raw (valid JSON)
// reading an array in place hashes what decoding it does, or fails the
// same way.
func assertSameContent(t *testing.T, raw []byte) {
	t.Helper()
	inPlace, decoded := newBlockHasher([]uint64{7}, "s"), newBlockHasher([]uint64{7}, "s")
	// Off the blocks' alignment, so that a part's bytes straddle blocks.
	inPlace.writeString("system\nabc")
	decoded.writeString("system\nabc")
	err := writeContent(&inPlace, raw)
	wantErr := decodeContent(&decoded, bytes.TrimSpace(raw))
	if wantErr != nil {
		assert.EqualError(t, err, wantErr.Error(), "%s", raw)
		return
	}
	require.NoError(t, err, "%s", raw)
	assert.Equal(t, decoded.out, inPlace.out, "%s", raw)
	assert.Equal(t, decoded.n, inPlace.n, "%s: the bytes of the last partial block", raw)
}

// contentArrays are content arrays of the shapes clients send, and of
// those left to the decoding.
func contentArrays() [][]byte {
	long := text("You are a helpful assistant.", 300)
	var arrays [][]byte
	for _, part := range []string{
		`"` + long + `"`,
		`{"type":"text","text":"` + long + `"}`,
		` { "TYPE" : "text" , "Text" : "` + long + `" , "cache_control" : {"type":"text","text":"]"} } `,
		`{"type":"image_url","image_url":{"url":"` + long + `"}}`,
		`{"text":"` + long + `"}`,
		`{"type":"text"}`,
		`{"type":"text","text":12}`,
		`{"type":"text","text":["` + long + `"]}`,
		`12345`, `-1.5e3`, `true`, `null`, `[1,2]`,
		`"x\"y\\` + long + `"`,
		// Left to the decoding.
		`{"type":"te\u0078t","text":"` + long + `"}`,
		`{"type":"téxt","text":"` + long + `"}`,
		`{"typ\u0065":"text","text":"` + long + `"}`,
		`{"type":"text","type":"image","text":"` + long + `"}`,
		`{"type":"text","text":"a","TEXT":"` + long + `"}`,
		`{"type":null,"text":"` + long + `"}`,
		`{"type":"text","text":null}`,
		`{"type":1,"text":"` + long + `"}`,
		`{"type":["text"],"text":"` + long + `"}`,
	} {
		arrays = append(arrays, []byte(`[`+part+`]`), []byte(`[ "`+long+`" , `+part+` , 42 ]`))
	}
	return append(arrays, []byte(`[]`), []byte(` [ ] `), []byte(`["`+long+`"]`))
}

func TestPromptBlocksInPlace(t *testing.T) {
	for _, body := range messageBodies(t) {
		assertSameBlocks(t, body)
	}
	for _, raw := range contentArrays() {
		assertSameContent(t, raw)
	}
	for _, tt := range []struct {
		name string
		body []byte
	}{
		{"the usual chat body", chatBody(t, text("You are a helpful assistant.", 3000), text("What is", 1096))},
		{"a chat body of text parts", []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"` + text("p", 4096) + `"},{"type":"image_url","image_url":{"url":"x"}}]}]}`)},
		{"a completions prompt of token ids", []byte(`{"prompt":[` + strings.Repeat("1234,", 1000) + `1]}`)},
	} {
		t.Run(tt.name+" is read without allocating", func(t *testing.T) {
			p := promptOf(tt.body)
			dst := make([]uint64, 0, MaxBlocks)
			allocs := testing.AllocsPerRun(20, func() {
				var err error
				dst, err = p.Blocks(dst[:0], "ns/pool")
				require.NoError(t, err)
			})
			assert.GreaterOrEqual(t, len(dst), 64)
			assert.Zero(t, allocs)
		})
	}
}

// FuzzPromptBlocks holds reading the messages in place to decoding them,
// for any body a client may send, and Opens to what decoding them says:
// a body it finds opening has messages and no assistant's among them.
func FuzzPromptBlocks(f *testing.F) {
	for _, body := range messageBodies(f) {
		f.Add(body)
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("ab", 100) + `"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		assertSameBlocks(t, body)
		if p := promptOf(body); p != nil && p.Opens() {
			var msgs []message
			for _, m := range p.messages {
				require.NoError(t, json.Unmarshal(m, &msgs), "%s", body)
			}
			require.NotEmpty(t, msgs, "%s", body)
			for _, m := range msgs {
				assert.NotEqual(t, "assistant", m.Role, "%s", body)
			}
		}
	})
}

// FuzzContent holds reading a content array in place to decoding it, for
// any array a client may send.
func FuzzContent(f *testing.F) {
	for _, raw := range contentArrays() {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if json.Valid(raw) {
			assertSameContent(t, raw)
		}
	})
}

func TestOpensIsAChatRequestWithoutAnAnswerBeforeIt(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		opens      bool
	}{
		{"a system prompt and the first user message", `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, true},
		{"a user message alone", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, true},
		{"the second turn resends the first answer", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}`, false},
		{"an answer whose content is null (a tool call)", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null},{"role":"tool","content":"42"}]}`, false},
		{"the word in a user's content is no answer", `{"model":"m","messages":[{"role":"user","content":"\"assistant\""}]}`, true},
		{"a completions prompt tells no turn", `{"model":"m","prompt":"hi"}`, false},
		{"no message", `{"model":"m","messages":[]}`, false},
		{"a role with escapes is not read", `{"model":"m","messages":[{"role":"\u0061ssistant","content":"x"},{"role":"user","content":"y"}]}`, false},
		{"a message without a role", `{"model":"m","messages":[{"content":"x"}]}`, false},
		{"messages that are not an array", `{"model":"m","messages":{"role":"user"}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := promptOf([]byte(tc.body))
			require.NotNil(t, p)
			assert.Equal(t, tc.opens, p.Opens())
		})
	}
}
