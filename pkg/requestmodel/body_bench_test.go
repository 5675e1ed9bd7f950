package requestmodel

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// BenchmarkReadBodyAndPrompt compares what the sidecar reads of a request
// body for a prefix-affinity pick: the model and the prompt's blocks, by
// one walk (ReadBody, Prompt.Blocks) or by two reads (ParseBody, Blocks).
func BenchmarkReadBodyAndPrompt(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 16<<10*4/45) // ~16k tokens
	chatBody, _ := json.Marshal(map[string]any{"model": "llm", "messages": []map[string]string{
		{"role": "system", "content": text[:len(text)/2]}, {"role": "user", "content": text[len(text)/2:]},
	}})
	completionsBody, _ := json.Marshal(map[string]any{"model": "llm", "prompt": text, "max_tokens": 16})
	for _, bc := range []struct {
		name string
		body []byte
	}{{"chat-16k", chatBody}, {"completions-16k", completionsBody}} {
		b.Run(bc.name+"/one-read", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				body, err := ReadBody(bc.body)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := body.Prompt().Blocks(nil, "s"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/two-reads", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseBody(bc.body); err != nil {
					b.Fatal(err)
				}
				if _, err := promptprefix.Blocks(nil, "s", bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
