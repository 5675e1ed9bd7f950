package promptprefix

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Prompt blocks. The sidecar does not tokenize: it does not know the
// model's tokenizer, and a tokenizer per model would cost more than the
// whole pick. A block is BlockBytes bytes of the prompt's text, 16 tokens
// at the ~4 bytes per token of English text under common BPE tokenizers,
// the block size of vLLM's prefix cache. Blocks need not align with the
// model server's own: what matters is that two prompts sharing a long
// prefix share their leading blocks, and that holds whatever the
// alignment.
const (
	// BlockBytes is the size of a prompt block.
	BlockBytes = 64
	// MaxBlocks bounds the blocks read from one prompt (32 KiB of text),
	// and so the cost of hashing, matching and recording it: prompts
	// sharing their first 32 KiB score the same.
	MaxBlocks = 512
)

// ErrNoPrompt means a body has neither a prompt nor messages.
var ErrNoPrompt = errors.New("request body has no prompt or messages")

// message is one chat message, as encoding/json reads it.
type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one part of a chat message's content array.
type contentPart struct {
	Type string          `json:"type"`
	Text json.RawMessage `json:"text"`
}

// Prompt is the members of a request body that make its prompt, gathered
// by a reader that walks the body's top-level members anyway (the
// sidecar's model lookup), so that the body is read once, not once for the
// model and once more for the prompt.
type Prompt struct {
	prompt   json.RawMessage
	messages []json.RawMessage
}

// Member records a top-level member of a request body that is a valid JSON
// object (json.Valid: Blocks reads the messages in place trusting it): key is its name as sent (quoted, escapes included), value its
// raw JSON value. Names match as encoding/json matches Blocks' struct
// fields: without regard to case, the last "prompt" winning and each
// "messages" decoded in turn into the same slice; so Prompt.Blocks hashes
// what Blocks hashes.
func (p *Prompt) Member(key, value []byte) {
	name := key[1 : len(key)-1]
	if bytes.IndexByte(name, '\\') >= 0 {
		var k string
		if json.Unmarshal(key, &k) != nil {
			return
		}
		name = []byte(k)
	}
	switch {
	case bytes.EqualFold(name, []byte("prompt")):
		p.prompt = value
	case bytes.EqualFold(name, []byte("messages")):
		p.messages = append(p.messages, value)
	}
}

// Blocks appends to dst the chained hashes of the prompt's full blocks,
// as the package's Blocks does for the body the members came from; only
// the messages are read, in place where they take the usual shape
// (messageBlocks), the rest of the body is not read again.
func (p *Prompt) Blocks(dst []uint64, scope string) ([]uint64, error) {
	switch len(p.messages) {
	case 0:
		return blocks(dst, scope, p.prompt, nil)
	case 1:
		if out, ok, err := messageBlocks(dst, scope, p.prompt, p.messages[0]); ok {
			return out, err
		}
	}
	return p.decodeBlocks(dst, scope)
}

// decodeBlocks is Blocks with the messages decoded by encoding/json.
func (p *Prompt) decodeBlocks(dst []uint64, scope string) ([]uint64, error) {
	var msgs []message
	for _, m := range p.messages {
		if err := json.Unmarshal(m, &msgs); err != nil {
			return dst, fmt.Errorf("reading the prompt: %w", err)
		}
	}
	return blocks(dst, scope, p.prompt, msgs)
}

// Blocks appends to dst the chained hashes of the prompt's full
// blocks. The text is the JSON text of the strings as sent, escapes
// included (a client that escapes the same text otherwise makes another
// prefix, as rare as it is harmless): that of a completions request's
// prompt (a string, or the
// strings of an array, one after the other; token ids as their decimal
// text, each followed by a comma), or, for a chat completions request, each message's
// role, a newline, its text content (a string, or the text parts of an
// array; other parts such as images are left out) and a newline. Each hash
// covers the block and the hash before it, the first one the scope as
// well, so a hash stands for the whole prefix up to its block, and the
// same prompt sent to two pools (scopes) is two prefixes. A trailing
// partial block is left out, as a model server caches full blocks only.
// A hash is never 0.
func Blocks(dst []uint64, scope string, body []byte) ([]uint64, error) {
	var pb struct {
		Prompt   json.RawMessage `json:"prompt"`
		Messages []message       `json:"messages"`
	}
	if err := json.Unmarshal(body, &pb); err != nil {
		return dst, fmt.Errorf("reading the prompt: %w", err)
	}
	return blocks(dst, scope, pb.Prompt, pb.Messages)
}

// blocks hashes a completions prompt or chat messages, as Blocks says.
func blocks(dst []uint64, scope string, prompt json.RawMessage, msgs []message) ([]uint64, error) {
	h := newBlockHasher(dst, scope)
	switch {
	case len(msgs) > 0:
		for _, m := range msgs {
			h.writeString(m.Role)
			h.writeString("\n")
			if err := writeContent(&h, m.Content); err != nil {
				return dst, err
			}
			h.writeString("\n")
		}
	case len(prompt) > 0 && !bytes.Equal(prompt, []byte("null")):
		if err := writeContent(&h, prompt); err != nil {
			return dst, err
		}
	default:
		return dst, ErrNoPrompt
	}
	return h.out, nil
}

// writeContent writes a string, or the strings (or text parts) of an
// array; anything else as its JSON text. raw is valid JSON (its reader
// validated it): an array is read in place (writeParts) where its parts
// take the usual shapes, decoded otherwise.
func writeContent(h *blockHasher, raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		saved := *h
		if writeParts(h, raw) {
			return nil
		}
		*h = saved
	}
	return decodeContent(h, raw)
}

// decodeContent is writeContent with an array decoded by encoding/json.
func decodeContent(h *blockHasher, raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil
	}
	switch raw[0] {
	case '"':
		// The string as sent, escapes included: json.Unmarshal has
		// checked it, and unescaping would cost a second pass and a copy.
		h.write(raw[1 : len(raw)-1])
		return nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return fmt.Errorf("reading the prompt: %w", err)
		}
		for _, part := range parts {
			part = bytes.TrimSpace(part)
			switch {
			case len(part) > 0 && part[0] == '"':
				if err := decodeContent(h, part); err != nil {
					return err
				}
			case len(part) > 0 && part[0] == '{':
				var cp contentPart
				if err := json.Unmarshal(part, &cp); err != nil {
					return fmt.Errorf("reading the prompt: %w", err)
				}
				if cp.Type == "text" && len(cp.Text) > 0 && cp.Text[0] == '"' {
					if err := decodeContent(h, cp.Text); err != nil {
						return err
					}
				}
			default:
				// A token id (or anything else): its JSON text, and a
				// comma so that 12,345 and 123,45 differ.
				h.write(part)
				h.writeString(",")
			}
		}
		return nil
	}
	h.write(raw)
	return nil
}

// blockHasher cuts a stream of text into blocks and chains their hashes.
type blockHasher struct {
	d    xxhash.Digest
	n    int // bytes of the current block written so far
	prev uint64
	out  []uint64
	full bool
	// base is len(out) before the first block.
	base int
}

func newBlockHasher(dst []uint64, scope string) blockHasher {
	h := blockHasher{out: dst, base: len(dst), prev: xxhash.Sum64String(scope)}
	h.start()
	return h
}

func (h *blockHasher) start() {
	h.d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], h.prev)
	_, _ = h.d.Write(b[:])
	h.n = 0
}

func (h *blockHasher) writeString(s string) {
	for len(s) > 0 && !h.full {
		k := min(len(s), BlockBytes-h.n)
		_, _ = h.d.WriteString(s[:k])
		s = s[k:]
		h.advance(k)
	}
}

func (h *blockHasher) write(p []byte) {
	for len(p) > 0 && !h.full {
		k := min(len(p), BlockBytes-h.n)
		_, _ = h.d.Write(p[:k])
		p = p[k:]
		h.advance(k)
	}
}

func (h *blockHasher) advance(k int) {
	if h.n += k; h.n < BlockBytes {
		return
	}
	h.prev = max(h.d.Sum64(), 1)
	h.out = append(h.out, h.prev)
	h.full = len(h.out)-h.base >= MaxBlocks
	h.start()
}
