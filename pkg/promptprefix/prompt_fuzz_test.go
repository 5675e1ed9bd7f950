package promptprefix

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// FuzzBlocks reads request bodies as a client sends them: whatever the
// body, Blocks does not panic, and what it accepts is at most MaxBlocks
// hashes, none of them 0 (the index's mark of a free entry).
func FuzzBlocks(f *testing.F) {
	f.Add([]byte(`{"prompt":"hello"}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`))
	f.Add([]byte(`{"prompt":[1,2,"a",{"b":1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		blocks, err := Blocks(nil, "s", body)
		if err != nil {
			return
		}
		assert.LessOrEqual(t, len(blocks), MaxBlocks)
		assert.NotContains(t, blocks, uint64(0))
	})
}
