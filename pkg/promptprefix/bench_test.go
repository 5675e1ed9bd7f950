package promptprefix

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkBlocks hashes a chat request of a 4 KiB prompt: reading
// the body (encoding/json) and hashing its text, reading the messages
// member only (and of a chat request of 80 KiB), then the hashing alone.
func BenchmarkBlocks(b *testing.B) {
	prompt := text("You are a helpful assistant.", 3000) + text("What is", 1096)
	body := chatBody(b, prompt[:3000], prompt[3000:])
	blocks := make([]uint64, 0, MaxBlocks)
	b.Run("chat-body", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var err error
			blocks, err = Blocks(blocks[:0], "ns/llm", body)
			if err != nil || len(blocks) != 64 {
				b.Fatal(len(blocks), err)
			}
		}
	})
	// The sidecar's way: the messages member its body reader gathered,
	// read in place, and decoded as before for comparison; for this body
	// and one of about 16k tokens (80 KiB, read up to MaxBlocks).
	long := chatBody(b, text("You are a helpful assistant.", 20_000), text("What is", 60_000))
	for _, c := range []struct {
		size string
		body []byte
	}{{"4k", body}, {"80k", long}} {
		p := promptOf(c.body)
		for name, read := range map[string]func([]uint64, string) ([]uint64, error){"members-in-place": p.Blocks, "members-decoded": p.decodeBlocks} {
			b.Run(name+"-"+c.size, func(b *testing.B) {
				b.SetBytes(int64(len(c.body)))
				b.ReportAllocs()
				for b.Loop() {
					var err error
					blocks, err = read(blocks[:0], "ns/llm")
					if err != nil || len(blocks) == 0 {
						b.Fatal(len(blocks), err)
					}
				}
			})
		}
	}
	b.Run("hash-only", func(b *testing.B) {
		b.SetBytes(int64(len(prompt)))
		b.ReportAllocs()
		for b.Loop() {
			h := newBlockHasher(blocks[:0], "ns/llm")
			h.writeString(prompt)
			blocks = h.out
		}
	})
}

// BenchmarkIndexMemory reports the index's memory per 100,000
// prefixes (blocks), full, and the cost of recording into a full index.
func BenchmarkIndexMemory(b *testing.B) {
	for _, capacity := range []int{100_000, 1 << 18, 1_000_000} {
		b.Run(fmt.Sprint(capacity), func(b *testing.B) {
			x := NewIndex(capacity)
			for i := range capacity / 50 * 2 {
				x.Record(chain(uint64(i), 50), ClusterID(strings.Repeat("c", 1+i%3)))
			}
			blocks := chain(1<<40, 64)
			for b.Loop() {
				x.Record(blocks, 1)
			}
			b.ReportMetric(float64(x.Bytes())*100_000/float64(x.Capacity()), "bytes/100k-prefixes")
			b.ReportMetric(float64(x.Bytes()), "index-bytes")
		})
	}
}

// BenchmarkOpens tells whether chat requests of about 1k and 16k tokens
// (4 and 80 KiB) open a conversation, as home placement asks of each.
func BenchmarkOpens(b *testing.B) {
	for _, c := range []struct {
		size string
		body []byte
	}{
		{"4k", chatBody(b, text("You are a helpful assistant.", 3000), text("What is", 1096))},
		{"80k", chatBody(b, text("You are a helpful assistant.", 20_000), text("What is", 60_000))},
	} {
		p := promptOf(c.body)
		b.Run(c.size, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if !p.Opens() {
					b.Fatal("a system prompt and a user message open a conversation")
				}
			}
		})
	}
}
