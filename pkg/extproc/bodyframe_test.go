package extproc

import (
	"testing"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// bodyFrameSeeds are encodings of ProcessingRequests: plain body chunks,
// in Go's field order and another, and messages that are not plain body
// chunks or not valid at all.
func bodyFrameSeeds(t testing.TB) map[string][]byte {
	enc := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		return b
	}
	chunk := func(fields ...[]byte) []byte {
		var inner []byte
		for _, f := range fields {
			inner = append(inner, f...)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), inner)
	}
	body := func(s string) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte(s))
	}
	eos := func(v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), v)
	}
	plain := enc(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","prompt":"hi"}`), EndOfStream: true}}})
	return map[string][]byte{
		"plain":                   plain,
		"end of stream first":     chunk(eos(1), body("abc")),
		"no end of stream":        chunk(body("abc")),
		"empty body":              chunk(body(""), eos(0)),
		"empty chunk":             chunk(),
		"end of stream as 2":      chunk(eos(2), body("x")),
		"body twice":              chunk(body("a"), body("b")),
		"end of stream twice":     chunk(eos(1), eos(0)),
		"unknown field":           chunk(body("a"), protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)),
		"chunk twice":             append(chunk(body("a")), chunk(eos(1))...),
		"metadata as well":        append(slicesClone(plain), enc(&extprocv3.ProcessingRequest{MetadataContext: &corev3.Metadata{}})...),
		"body as a varint":        chunk(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 5)),
		"truncated":               plain[:len(plain)-3],
		"truncated tag":           chunk([]byte{0x80}),
		"headers":                 enc(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}),
		"response body":           enc(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: x"), EndOfStream: true}}}),
		"response body with more": append(enc(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("x")}}}), enc(&extprocv3.ProcessingRequest{ObservabilityMode: true})...),
		"trailers":                enc(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}),
		"end of stream too long":  chunk(append(protowire.AppendTag(nil, 2, protowire.VarintType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)),
		"nothing":                 {},
		"garbage":                 {0xff, 0xff, 0xff},
		"body past the chunk end": protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), append(protowire.AppendTag(nil, 1, protowire.BytesType), 10, 'a')),
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// TestUnmarshalRequest checks that a request read by unmarshalRequest is
// what proto.Unmarshal reads, and that a plain body chunk's body is read
// in place: the bytes of the frame, not a copy.
func TestUnmarshalRequest(t *testing.T) {
	inPlace := map[string]bool{"plain": true, "end of stream first": true, "no end of stream": true, "end of stream as 2": true, "response body": true}
	for name, b := range bodyFrameSeeds(t) {
		t.Run(name, func(t *testing.T) {
			checkUnmarshalRequest(t, b)
			got := &extprocv3.ProcessingRequest{}
			if err := unmarshalRequest(b, got); err != nil || !inPlace[name] {
				return
			}
			body := got.GetRequestBody().GetBody()
			if got.GetResponseBody() != nil {
				body = got.GetResponseBody().GetBody()
			}
			require.NotEmpty(t, body)
			start := uintptr(unsafe.Pointer(&b[0]))
			at := uintptr(unsafe.Pointer(&body[0]))
			assert.True(t, at >= start && at < start+uintptr(len(b)), "the body is read in place")
			assert.Equal(t, len(body), cap(body), "the body is clipped, so that an append cannot write over the frame")
		})
	}
}

// checkUnmarshalRequest fails when unmarshalRequest and proto.Unmarshal
// read b differently.
func checkUnmarshalRequest(t *testing.T, b []byte) {
	want := &extprocv3.ProcessingRequest{}
	wantErr := proto.Unmarshal(b, want)
	// A message that held something already, as a reused one would.
	got := &extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestTrailers{}}
	err := unmarshalRequest(b, got)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("unmarshalRequest: %v, proto.Unmarshal: %v", err, wantErr)
	}
	if err == nil && !proto.Equal(want, got) {
		t.Fatalf("unmarshalRequest read %v, proto.Unmarshal %v", got, want)
	}
}

// FuzzUnmarshalRequest checks that unmarshalRequest reads any bytes as
// proto.Unmarshal does.
func FuzzUnmarshalRequest(f *testing.F) {
	for _, b := range bodyFrameSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(checkUnmarshalRequest)
}
