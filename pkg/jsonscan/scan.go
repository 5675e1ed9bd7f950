// Package jsonscan walks JSON text that json.Valid has accepted, without
// decoding it: where a value, a string or the blanks between tokens end.
// On text that is not valid JSON its functions may panic.
package jsonscan

import "bytes"

// SkipSpace returns the index of the first byte at or after i that is not
// a blank.
func SkipSpace(raw []byte, i int) int {
	for i < len(raw) {
		switch raw[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// StringEnd returns the index after the string starting at raw[i] == '"'.
// A quote ends the string unless an odd number of backslashes precede it.
func StringEnd(raw []byte, i int) int {
	j := i + 1
	for {
		q := bytes.IndexByte(raw[j:], '"') + j
		n := 0
		for k := q - 1; raw[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// ValueEnd returns the index after the value starting at raw[i].
func ValueEnd(raw []byte, i int) int {
	switch raw[i] {
	case '"':
		return StringEnd(raw, i)
	case '{', '[':
		depth := 0
		for j := i; ; {
			k := bytes.IndexAny(raw[j:], `"{}[]`) + j
			switch raw[k] {
			case '"':
				j = StringEnd(raw, k)
				continue
			case '{', '[':
				depth++
			default:
				if depth--; depth == 0 {
					return k + 1
				}
			}
			j = k + 1
		}
	default:
		// A number, true, false or null: up to the next delimiter.
		j := i
		for ; j < len(raw); j++ {
			switch raw[j] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return j
			}
		}
		return j
	}
}
