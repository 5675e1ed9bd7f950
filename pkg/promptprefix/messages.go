package promptprefix

import (
	"bytes"
	"encoding/json"

	"github.com/mci-dev/mci/pkg/jsonscan"
)

// Chat messages and content arrays read in place. Decoding the messages
// into values cost ten to twenty times what hashing their text does (each
// content copied, every byte run through encoding/json's state machine),
// for a walk that needs only where each role, content and text part are.
// Prompt.Blocks reads a request's messages, and writeContent an array of
// content parts or token ids, in place where they take the shapes clients
// send; where they take one whose reading by encoding/json this does not
// mirror exactly (an escaped or non-ASCII key or part type, a key twice, a
// null role, content, type or text, a message that is not an object, a
// role or type that is not a string), they are decoded as they always
// were, so that both ways give the same hashes and the same errors.

// messageBlocks hashes the chat messages raw, the one "messages" member of
// a body that is valid JSON, as blocks does their decoding: ok is false
// where raw takes a shape this does not read, and then nothing is
// returned.
func messageBlocks(dst []uint64, scope string, prompt, raw json.RawMessage) (out []uint64, ok bool, err error) {
	i := jsonscan.SkipSpace(raw, 0)
	if i == len(raw) || raw[i] != '[' {
		return nil, false, nil
	}
	h := newBlockHasher(dst, scope)
	n := 0
	for i = jsonscan.SkipSpace(raw, i+1); raw[i] != ']'; n++ {
		if raw[i] != '{' {
			return nil, false, nil
		}
		role, content, end, ok := readMessage(raw, i)
		if !ok {
			return nil, false, nil
		}
		if role == nil {
			role = []byte(`""`)
		}
		switch text := role[1 : len(role)-1]; {
		case bytes.IndexByte(text, '\\') >= 0 || !ascii(text):
			// What encoding/json makes of escapes and of bytes that are
			// not UTF-8.
			var s string
			if json.Unmarshal(role, &s) != nil {
				return nil, false, nil
			}
			h.writeString(s)
		default:
			h.write(text)
		}
		h.writeString("\n")
		if writeContent(&h, content) != nil {
			// Whose error, and which, is the decoding's to say.
			return nil, false, nil
		}
		h.writeString("\n")
		if i = jsonscan.SkipSpace(raw, end); raw[i] == ',' {
			i = jsonscan.SkipSpace(raw, i+1)
		}
	}
	if n == 0 {
		out, err = blocks(dst, scope, prompt, nil)
		return out, true, err
	}
	return h.out, true, nil
}

// readMessage reads the message object at raw[i]: its role (the JSON
// string, nil: none) and its content's JSON
// value (nil: none), and the index after the object. ok is false for a
// message whose decoding readMessage does not mirror.
func readMessage(raw []byte, i int) (role, content []byte, end int, ok bool) {
	j := jsonscan.SkipSpace(raw, i+1)
	for raw[j] != '}' {
		keyEnd := jsonscan.StringEnd(raw, j)
		key := raw[j+1 : keyEnd-1]
		if bytes.IndexByte(key, '\\') >= 0 || !ascii(key) {
			return nil, nil, 0, false
		}
		start := jsonscan.SkipSpace(raw, jsonscan.SkipSpace(raw, keyEnd)+1)
		end := jsonscan.ValueEnd(raw, start)
		value := raw[start:end]
		switch {
		case bytes.EqualFold(key, []byte("role")):
			if role != nil || value[0] != '"' {
				return nil, nil, 0, false
			}
			role = value
		case bytes.EqualFold(key, []byte("content")):
			if content != nil || value[0] == 'n' {
				return nil, nil, 0, false
			}
			content = value
		}
		if j = jsonscan.SkipSpace(raw, end); raw[j] == ',' {
			j = jsonscan.SkipSpace(raw, j+1)
		}
	}
	return role, content, j + 1, true
}

// ascii reports whether b is all ASCII.
func ascii(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// writeParts writes the parts of the array raw (valid JSON) as
// decodeContent does, reading them in place: ok is false where a part
// object takes a shape whose decoding writeParts does not mirror (as
// readMessage), and then what was written is to be discarded.
func writeParts(h *blockHasher, raw []byte) (ok bool) {
	for i := jsonscan.SkipSpace(raw, 1); raw[i] != ']'; {
		end := jsonscan.ValueEnd(raw, i)
		switch part := raw[i:end]; part[0] {
		case '"':
			h.write(part[1 : len(part)-1])
		case '{':
			typ, text, ok := readPart(part)
			if !ok {
				return false
			}
			if string(typ) == `"text"` && text != nil && text[0] == '"' {
				h.write(text[1 : len(text)-1])
			}
		default:
			// A token id (or anything else): its JSON text, and a comma.
			h.write(part)
			h.writeString(",")
		}
		if i = jsonscan.SkipSpace(raw, end); raw[i] == ',' {
			i = jsonscan.SkipSpace(raw, i+1)
		}
	}
	return true
}

// readPart reads a content part object: its type (the JSON string, nil:
// none) and its text's JSON value (nil: none). ok is false for a part
// whose decoding readPart does not mirror: an escaped or non-ASCII key, a
// key twice, a null type or text, a type that is not a string of plain
// ASCII.
func readPart(part []byte) (typ, text []byte, ok bool) {
	for j := jsonscan.SkipSpace(part, 1); part[j] != '}'; {
		keyEnd := jsonscan.StringEnd(part, j)
		key := part[j+1 : keyEnd-1]
		if bytes.IndexByte(key, '\\') >= 0 || !ascii(key) {
			return nil, nil, false
		}
		start := jsonscan.SkipSpace(part, jsonscan.SkipSpace(part, keyEnd)+1)
		end := jsonscan.ValueEnd(part, start)
		value := part[start:end]
		switch {
		case bytes.EqualFold(key, []byte("type")):
			if typ != nil || value[0] != '"' || bytes.IndexByte(value, '\\') >= 0 || !ascii(value) {
				return nil, nil, false
			}
			typ = value
		case bytes.EqualFold(key, []byte("text")):
			if text != nil || value[0] == 'n' {
				return nil, nil, false
			}
			text = value
		}
		if j = jsonscan.SkipSpace(part, end); part[j] == ',' {
			j = jsonscan.SkipSpace(part, j+1)
		}
	}
	return typ, text, true
}

// Opens reports whether the prompt opens a conversation: chat messages
// none of which is an assistant's. A client continuing a conversation
// sends the answers it had as assistant messages, so a request without one
// is a conversation's first turn, whose prompt past the system's no server
// holds yet. False for a completions prompt (nothing tells a turn there)
// and for messages this does not read in place (a shape only the decoder
// reads, or a role with escapes): a request it cannot tell is taken to
// continue, so that nothing moves it off the history it may have.
func (p *Prompt) Opens() bool {
	n := 0
	for _, raw := range p.messages {
		i := jsonscan.SkipSpace(raw, 0)
		if i == len(raw) || raw[i] != '[' {
			return false
		}
		for i = jsonscan.SkipSpace(raw, i+1); raw[i] != ']'; {
			if raw[i] != '{' {
				return false
			}
			role, _, end, ok := readMessage(raw, i)
			if !ok || role == nil || bytes.IndexByte(role, '\\') >= 0 || string(role) == `"assistant"` {
				return false
			}
			if i = jsonscan.SkipSpace(raw, end); raw[i] == ',' {
				i = jsonscan.SkipSpace(raw, i+1)
			}
			n++
		}
	}
	return n > 0
}
