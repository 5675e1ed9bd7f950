package jsonframe

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// chunked returns its text at most size bytes a Read, as a watch's body
// returns what has arrived.
type chunked struct {
	text []byte
	size int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.text) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.size, len(c.text))
	copy(p, c.text[:n])
	c.text = c.text[n:]
	return n, nil
}

func (c *chunked) Close() error { return nil }

// frames reads every frame of text through a frame reader, bufSize bytes
// a Read at most, growing the frame as client-go's streaming decoder
// does on io.ErrShortBuffer; it returns the frames and the error that
// ended them (nil for io.EOF).
func frames(f runtime.Framer, text []byte, chunk, bufSize int) ([]string, error) {
	r := f.NewFrameReader(&chunked{text: text, size: chunk})
	var out []string
	for len(out) <= len(text) {
		var frame []byte
		buf := make([]byte, bufSize)
		for {
			n, err := r.Read(buf)
			frame = append(frame, buf[:n]...)
			if errors.Is(err, io.ErrShortBuffer) {
				continue
			}
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			if err != nil {
				return out, err
			}
			break
		}
		out = append(out, string(bytes.TrimSpace(frame)))
	}
	panic("more frames than bytes")
}

func TestAStreamIsReadOneValueAFrame(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream string
		frames []string
		err    error
	}{
		{name: "events one a line, as a server writes them",
			stream: "{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n{\"type\":\"BOOKMARK\",\"object\":{}}\n",
			frames: []string{`{"type":"ADDED","object":{"a":1}}`, `{"type":"BOOKMARK","object":{}}`}},
		{name: "values with nothing between them",
			stream: `{"a":[1,{"b":2}]}[3]{}`,
			frames: []string{`{"a":[1,{"b":2}]}`, `[3]`, `{}`}},
		{name: "brackets and quotes inside strings",
			stream: `{"s":"}{][\"\\","t":"\\"}` + "\n" + `{"u":"\u007d"}`,
			frames: []string{`{"s":"}{][\"\\","t":"\\"}`, `{"u":"\u007d"}`}},
		{name: "blanks before, between and after",
			stream: " \t\r\n{\"a\":1}  \n\n {\"b\":2} \n",
			frames: []string{`{"a":1}`, `{"b":2}`}},
		{name: "an empty stream", stream: ""},
		{name: "blanks only", stream: " \n\t"},
		{name: "a stream cut inside a value",
			stream: `{"a":1}{"b":`,
			frames: []string{`{"a":1}`}, err: io.ErrUnexpectedEOF},
		{name: "a stream cut inside a string",
			stream: `{"a":"}`, err: io.ErrUnexpectedEOF},
		{name: "a value that is not an object",
			stream: `{"a":1} 42`,
			frames: []string{`{"a":1}`}, err: ErrNotAnObject},
		{name: "a closing bracket first", stream: `}{}`, err: ErrNotAnObject},
	} {
		// Every way of cutting the stream into reads, and buffers smaller
		// and larger than a value, give the same frames.
		for _, chunk := range []int{1, 2, 3, 7, 64, 1 << 20} {
			for _, bufSize := range []int{1, 2, 5, 16, 1024} {
				got, err := frames(Framer, []byte(tc.stream), chunk, bufSize)
				if tc.err == nil {
					assert.NoError(t, err, "%s, reads of %d, buffer of %d", tc.name, chunk, bufSize)
				} else {
					assert.ErrorIs(t, err, tc.err, "%s, reads of %d, buffer of %d", tc.name, chunk, bufSize)
				}
				assert.Equal(t, tc.frames, got, "%s, reads of %d, buffer of %d", tc.name, chunk, bufSize)
			}
		}
	}
}

// The frames of a stream of valid JSON values are those apimachinery's
// JSON framer reads, however the stream arrives and whatever the buffer.
func TestFramesAreApimachinerys(t *testing.T) {
	stream := []byte{}
	for _, v := range []any{
		map[string]any{"type": "ADDED", "object": map[string]any{"metadata": map[string]any{"name": "a{b}", "annotations": map[string]any{"x": "\"]["}}}},
		[]any{1, "two", nil, true, map[string]any{}},
		map[string]any{"s": "é\u2028\\", "n": -1.5e10, "deep": []any{[]any{[]any{map[string]any{"k": "}"}}}}},
	} {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		stream = append(append(stream, b...), '\n')
	}
	want, err := frames(kjson.Framer, stream, len(stream), len(stream))
	require.NoError(t, err)
	require.Len(t, want, 3)
	for _, chunk := range []int{1, 3, 10, 100} {
		for _, bufSize := range []int{1, 4, 33, 4096} {
			got, err := frames(Framer, stream, chunk, bufSize)
			require.NoError(t, err)
			assert.Equal(t, want, got, "reads of %d, buffer of %d", chunk, bufSize)
		}
	}
}

// Between values the reader keeps only what a read returned past the last
// one, and nothing once that is read.
func TestNothingIsKeptBetweenValues(t *testing.T) {
	r := Framer.NewFrameReader(&chunked{text: []byte(`{"a":1}{"b":2}`), size: 1 << 10}).(*reader)
	buf := make([]byte, 64)
	n, err := r.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, `{"a":1}`, string(buf[:n]))
	assert.Equal(t, `{"b":2}`, string(r.pending), "the next value, read with the first")
	n, err = r.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, `{"b":2}`, string(buf[:n]))
	assert.Nil(t, r.pending)
}

// The negotiated serializer reads JSON watch streams through Framer and
// is otherwise the one it wraps.
func TestTheNegotiatedSerializerFramesJSONStreamsOnly(t *testing.T) {
	codecs := serializer.NewCodecFactory(runtime.NewScheme())
	ns := NegotiatedSerializer(codecs.WithoutConversion())
	var sawJSON bool
	for i, info := range ns.SupportedMediaTypes() {
		orig := codecs.WithoutConversion().SupportedMediaTypes()[i]
		assert.Equal(t, orig.MediaType, info.MediaType)
		assert.Equal(t, orig.Serializer, info.Serializer)
		if info.MediaType == runtime.ContentTypeJSON {
			sawJSON = true
			require.NotNil(t, info.StreamSerializer)
			assert.Equal(t, Framer, info.StreamSerializer.Framer)
			assert.Equal(t, orig.StreamSerializer.Serializer, info.StreamSerializer.Serializer)
			assert.NotEqual(t, Framer, orig.StreamSerializer.Framer, "the wrapped serializer is not changed")
		} else if orig.StreamSerializer != nil {
			assert.Equal(t, orig.StreamSerializer.Framer, info.StreamSerializer.Framer, info.MediaType)
		}
	}
	assert.True(t, sawJSON)
}
