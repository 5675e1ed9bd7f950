package promptprefix

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// text returns n bytes of distinct text starting with prefix.
func text(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i := 0; b.Len() < n; i++ {
		b.WriteString(" word")
		b.WriteString(strings.Repeat("x", i%7))
	}
	return b.String()[:n]
}

func chatBody(t testing.TB, msgs ...string) []byte {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, m := range msgs {
		ms = append(ms, msg{Role: []string{"system", "user", "assistant"}[min(i, 1+i%2)], Content: m})
	}
	body, err := json.Marshal(map[string]any{"model": "m", "messages": ms})
	require.NoError(t, err)
	return body
}

func TestBlocks(t *testing.T) {
	system := text("You are a helpful assistant.", 1000)
	blocks := func(scope string, body []byte) []uint64 {
		t.Helper()
		b, err := Blocks(nil, scope, body)
		require.NoError(t, err)
		return b
	}
	t.Run("a conversation's next turn extends the blocks of the turn before", func(t *testing.T) {
		turn1 := blocks("ns/pool", chatBody(t, system, text("What is", 300)))
		turn2 := blocks("ns/pool", chatBody(t, system, text("What is", 300), text("It is", 400), text("And then", 200)))
		require.Greater(t, len(turn2), len(turn1))
		// The last block of turn 1 ends inside the text turn 2 continues,
		// the newline after the message aside.
		assert.Equal(t, turn1[:len(turn1)-1], turn2[:len(turn1)-1])
	})
	t.Run("two prompts sharing a system prompt share its blocks, then differ", func(t *testing.T) {
		a := blocks("ns/pool", chatBody(t, system, text("Alpha", 500)))
		b := blocks("ns/pool", chatBody(t, system, text("Beta", 500)))
		shared := (len("system\n") + len(system)) / BlockBytes
		assert.Equal(t, a[:shared], b[:shared])
		assert.NotEqual(t, a[shared+1:], b[shared+1:])
	})
	t.Run("the same prompt in another scope has other blocks", func(t *testing.T) {
		assert.NotEqual(t, blocks("ns/a", chatBody(t, system)), blocks("ns/b", chatBody(t, system)))
	})
	t.Run("only full blocks count", func(t *testing.T) {
		assert.Len(t, blocks("s", []byte(`{"prompt":"`+text("x", 3*BlockBytes+10)+`"}`)), 3)
		assert.Empty(t, blocks("s", []byte(`{"prompt":"short"}`)))
	})
	t.Run("a completions prompt array reads as its strings one after the other", func(t *testing.T) {
		p := text("p", 4*BlockBytes)
		one := blocks("s", []byte(`{"prompt":"`+p+`"}`))
		two := blocks("s", []byte(`{"prompt":["`+p[:100]+`","`+p[100:]+`"]}`))
		assert.Equal(t, one, two)
		assert.Len(t, one, 4)
	})
	t.Run("chat content parts: text parts count, images do not", func(t *testing.T) {
		p := text("p", 2*BlockBytes)
		plain := blocks("s", []byte(`{"messages":[{"role":"user","content":"`+p+`"}]}`))
		parts := blocks("s", []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"`+p+`"},{"type":"image_url","image_url":{"url":"x"}}]}]}`))
		assert.Equal(t, plain, parts)
	})
	t.Run("token ids are read as their JSON text", func(t *testing.T) {
		assert.Len(t, blocks("s", []byte(`{"prompt":[`+strings.Repeat("1234,", 40)+`1]}`)), 3)
	})
	t.Run("a long prompt is read up to MaxBlocks", func(t *testing.T) {
		assert.Len(t, blocks("s", []byte(`{"prompt":"`+text("p", (MaxBlocks+10)*BlockBytes)+`"}`)), MaxBlocks)
	})
	t.Run("no hash is 0", func(t *testing.T) {
		assert.NotContains(t, blocks("s", chatBody(t, system)), uint64(0))
	})

	for _, tt := range []struct{ name, body, wantErr string }{
		{name: "a body that is not JSON is an error", body: `{"prompt":`, wantErr: "reading the prompt"},
		{name: "a body without prompt or messages is an error", body: `{"model":"m"}`, wantErr: ErrNoPrompt.Error()},
		{name: "a null prompt is no prompt", body: `{"prompt":null}`, wantErr: ErrNoPrompt.Error()},
		{name: "a malformed content part is an error", body: `{"messages":[{"role":"user","content":[{"type":1}]}]}`, wantErr: "reading the prompt"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Blocks(nil, "s", []byte(tt.body))
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}
