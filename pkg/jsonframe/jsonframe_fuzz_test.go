package jsonframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// FuzzFrames reads any stream in any reads and buffers without a panic
// and within a frame a byte, and reads a stream of JSON objects and arrays
// into the frames apimachinery's framer reads.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("{\"type\":\"ADDED\",\"object\":{\"a\":\"}\"}}\n{}\n"), uint8(3), uint8(5))
	f.Add([]byte(`[1,"\"",{"a":[]}] {"b":"\\"}`), uint8(1), uint8(1))
	f.Add([]byte(`{"a":1} 42 {`), uint8(2), uint8(16))
	f.Add([]byte("\x00{\xff}"), uint8(7), uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, chunk, bufSize uint8) {
		got, err := frames(Framer, stream, int(chunk)+1, int(bufSize)+1)
		if !objectsOnly(stream) {
			return
		}
		if err != nil {
			t.Fatalf("a stream of JSON objects: %v", err)
		}
		want, err := frames(kjson.Framer, stream, len(stream)+1, len(stream)+1)
		if err != nil {
			t.Fatalf("apimachinery's framer: %v", err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d frames, apimachinery's framer read %d", len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(compact(t, got[i]), compact(t, want[i])) {
				t.Fatalf("frame %d: %q, apimachinery's framer read %q", i, got[i], want[i])
			}
		}
	})
}

// objectsOnly says whether stream is JSON objects and arrays one after
// another, as a watch sends.
func objectsOnly(stream []byte) bool {
	d := json.NewDecoder(bytes.NewReader(stream))
	for {
		var v json.RawMessage
		err := d.Decode(&v)
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil || (v[0] != '{' && v[0] != '[') {
			return false
		}
	}
}

func compact(t *testing.T, s string) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("frame %q: %v", s, err)
	}
	return b.Bytes()
}
