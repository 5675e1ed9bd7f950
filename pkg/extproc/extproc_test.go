package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// fakeStream replays in, then returns end (io.EOF when nil), and records
// what is sent.
type fakeStream struct {
	in   []*extprocv3.ProcessingRequest
	end  error
	sent []*extprocv3.ProcessingResponse
}

func (f *fakeStream) Context() context.Context { return context.Background() }

func (f *fakeStream) Send(r *extprocv3.ProcessingResponse) error {
	f.sent = append(f.sent, r)
	return nil
}

func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.in) == 0 {
		if f.end != nil {
			return nil, f.end
		}
		return nil, io.EOF
	}
	m := f.in[0]
	f.in = f.in[1:]
	return m, nil
}

func headers(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos},
	}}
}

func body(chunk string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: eos},
	}}
}

func trailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{},
	}}
}

func withMetadata(m *extprocv3.ProcessingRequest, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	m.MetadataContext = md
	return m
}

func TestReadRequest(t *testing.T) {
	hint := SubsetHintMetadata("10.0.0.1:8000")
	tests := []struct {
		name        string
		in          []*extprocv3.ProcessingRequest
		end         error
		maxBody     int64
		wantBody    string
		wantNilBody bool
		wantHeader  map[string]string
		wantHint    bool
		wantErr     error
	}{
		{
			name:       "chunks are buffered until end_of_stream",
			in:         []*extprocv3.ProcessingRequest{headers(false, ":path", "/v1/completions", "Content-Type", "application/json"), body(`{"model":`, false), body(`"a"}`, true)},
			wantBody:   `{"model":"a"}`,
			wantHeader: map[string]string{":path": "/v1/completions", "content-type": "application/json"},
		},
		{
			name:        "headers ending the stream make a request without a body",
			in:          []*extprocv3.ProcessingRequest{headers(true, ":method", "GET")},
			wantNilBody: true,
			wantHeader:  map[string]string{":method": "GET"},
		},
		{
			name:     "trailers end the body",
			in:       []*extprocv3.ProcessingRequest{headers(false), body("abc", false), trailers()},
			wantBody: "abc",
		},
		{
			name:     "an empty last chunk ends the body",
			in:       []*extprocv3.ProcessingRequest{headers(false), body("abc", false), body("", true)},
			wantBody: "abc",
		},
		{
			name:     "metadata of a later message is kept when the headers carry none",
			in:       []*extprocv3.ProcessingRequest{headers(false), withMetadata(body("x", true), hint)},
			wantBody: "x",
			wantHint: true,
		},
		{
			name:     "a body of exactly the limit is accepted",
			in:       []*extprocv3.ProcessingRequest{headers(false), body("12345", false), body("678", true)},
			maxBody:  8,
			wantBody: "12345678",
		},
		{
			name:    "a body past the limit stops the reading",
			in:      []*extprocv3.ProcessingRequest{headers(false), body("12345", false), body("6789", true)},
			maxBody: 8,
			wantErr: ErrBodyTooLarge,
		},
		{
			name:    "a stream ending in the middle of the body is unexpected",
			in:      []*extprocv3.ProcessingRequest{headers(false), body("12345", false)},
			wantErr: io.ErrUnexpectedEOF,
		},
		{
			name:    "a stream error is returned as is",
			in:      []*extprocv3.ProcessingRequest{headers(false)},
			end:     context.Canceled,
			wantErr: context.Canceled,
		},
		{
			name:    "a stream not starting with request headers is a protocol violation",
			in:      []*extprocv3.ProcessingRequest{body("x", true)},
			wantErr: ErrProtocol,
		},
		{
			name: "response headers in the middle of the request body are a protocol violation",
			in: []*extprocv3.ProcessingRequest{headers(false), {Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{},
			}}},
			wantErr: ErrProtocol,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := ReadRequest(&fakeStream{in: tt.in, end: tt.end}, tt.maxBody)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.wantNilBody {
				assert.Nil(t, req.Body)
			} else {
				assert.Equal(t, tt.wantBody, string(req.Body))
			}
			for k, v := range tt.wantHeader {
				assert.Equal(t, v, req.Header(k), k)
			}
			_, present, err := SubsetHint(req.Metadata)
			require.NoError(t, err)
			assert.Equal(t, tt.wantHint, present)
		})
	}
}

// TestReadRequestCopiesOnlyWhatItMust checks that a body in one chunk, as
// most are, is read as that chunk's bytes, and that a body in several
// chunks is gathered into a body of its own, which leaves the chunks as
// they were.
func TestReadRequestCopiesOnlyWhatItMust(t *testing.T) {
	one := body(`{"model":"m"}`, true)
	req, err := ReadRequest(&fakeStream{in: []*extprocv3.ProcessingRequest{headers(false, "content-length", "13"), one}}, 0)
	require.NoError(t, err)
	assert.Same(t, &one.GetRequestBody().Body[0], &req.Body[0], "a body in one chunk is the chunk's bytes")

	first, last := body(`{"model":`, false), body(`"m"}`, true)
	req, err = ReadRequest(&fakeStream{in: []*extprocv3.ProcessingRequest{headers(false, "content-length", "13"), first, last}}, 0)
	require.NoError(t, err)
	assert.Equal(t, `{"model":"m"}`, string(req.Body))
	assert.Equal(t, 13, cap(req.Body), "one allocation of the announced length")
	assert.Equal(t, `{"model":`, string(first.GetRequestBody().GetBody()), "the chunks are left as they were")
}

func TestHeaderValuePrefersRawValue(t *testing.T) {
	assert.Equal(t, "raw", HeaderValue(&corev3.HeaderValue{Key: "k", Value: "v", RawValue: []byte("raw")}))
	assert.Equal(t, "v", HeaderValue(&corev3.HeaderValue{Key: "k", Value: "v"}))
	m := HeaderMapToMap(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: "X-A", Value: "1"}, {Key: "x-a", Value: "2"},
	}})
	assert.Equal(t, []string{"1", "2"}, m["x-a"])
}

func TestHeaderMapToMapKeepsValuesApart(t *testing.T) {
	m := HeaderMapToMap(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: "X-Rep", RawValue: []byte("first")},
		{Key: "empty", RawValue: []byte{}},
		{Key: "x-value", Value: "from value"},
		{Key: "x-rep", RawValue: []byte("second")},
		{Key: "host", RawValue: []byte("example.com")},
	}})
	assert.Equal(t, map[string][]string{
		":path":   {"/v1/completions"},
		"x-rep":   {"first", "second"},
		"empty":   {""},
		"x-value": {"from value"},
		"host":    {"example.com"},
	}, m)

	// The values share their storage: appending to one header's values
	// must not write over another's.
	m[":path"] = append(m[":path"], "appended")
	m["empty"] = append(m["empty"], "appended")
	assert.Equal(t, []string{"first", "second"}, m["x-rep"])
	assert.Equal(t, []string{"from value"}, m["x-value"])
	assert.Equal(t, []string{"example.com"}, m["host"])
}

// streamed collects the streamed body of resps and whether the last chunk
// ended the stream.
func streamed(t *testing.T, resps []*extprocv3.ProcessingResponse) (string, bool) {
	var b strings.Builder
	eos := false
	for _, r := range resps {
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			continue
		}
		require.False(t, eos, "a chunk after end_of_stream")
		b.Write(sr.GetBody())
		eos = sr.GetEndOfStream()
	}
	return b.String(), eos
}

func setHeaders(r *extprocv3.ProcessingResponse) map[string]string {
	m := map[string]string{}
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		m[h.GetHeader().GetKey()] = HeaderValue(h.GetHeader())
	}
	return m
}

func TestRoute(t *testing.T) {
	read := func(t *testing.T, in ...*extprocv3.ProcessingRequest) *Request {
		req, err := ReadRequest(&fakeStream{in: in}, 0)
		require.NoError(t, err)
		return req
	}

	t.Run("the destination goes into the header and the dynamic metadata, the body streams back unchanged", func(t *testing.T) {
		req := read(t, headers(false), body(`{"model":"a"}`, true))
		resps := req.Route([]string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil)
		require.Len(t, resps, 2)
		h := setHeaders(resps[0])
		assert.Equal(t, "10.0.0.1:8000,10.0.0.2:8000", h[DestinationEndpointHeader])
		assert.NotContains(t, h, "content-length", "an unchanged body keeps its length")
		assert.Equal(t, "10.0.0.1:8000,10.0.0.2:8000", DestinationFromMetadata(resps[0].GetDynamicMetadata()))
		assert.True(t, resps[0].GetRequestHeaders().GetResponse().GetClearRouteCache())
		for _, o := range resps[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			assert.Equal(t, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, o.GetAppendAction(), "a caller's header must be replaced, not appended to")
		}
		b, eos := streamed(t, resps)
		assert.Equal(t, `{"model":"a"}`, b)
		assert.True(t, eos)
	})

	t.Run("a replaced body streams back with its content-length", func(t *testing.T) {
		req := read(t, headers(false, "content-length", "13"), body(`{"model":"a"}`, true))
		resps := req.Route([]string{"10.0.0.1:8000"}, []byte(`{"model":"abc"}`))
		assert.Equal(t, "15", setHeaders(resps[0])["content-length"])
		b, eos := streamed(t, resps)
		assert.Equal(t, `{"model":"abc"}`, b)
		assert.True(t, eos)
	})

	t.Run("a request without a body gets only the headers response", func(t *testing.T) {
		req := read(t, headers(true))
		resps := req.Route([]string{"10.0.0.1:8000"}, nil)
		require.Len(t, resps, 1)
		assert.NotNil(t, resps[0].GetRequestHeaders())
	})

	t.Run("a request ended by trailers gets its body without end_of_stream, then a trailers response", func(t *testing.T) {
		req := read(t, headers(false), body("abc", false), trailers())
		resps := req.Route([]string{"10.0.0.1:8000"}, nil)
		b, eos := streamed(t, resps)
		assert.Equal(t, "abc", b)
		assert.False(t, eos)
		assert.NotNil(t, resps[len(resps)-1].GetRequestTrailers())
	})

	t.Run("a large body streams back in chunks no larger than ChunkSize", func(t *testing.T) {
		big := strings.Repeat("x", 2*ChunkSize+10)
		req := read(t, headers(false), body(big, true))
		resps := req.Route([]string{"10.0.0.1:8000"}, nil)
		require.Len(t, resps, 4)
		for _, r := range resps[1:] {
			assert.LessOrEqual(t, len(r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()), ChunkSize)
		}
		b, eos := streamed(t, resps)
		assert.Equal(t, big, b)
		assert.True(t, eos)
	})
}

func TestStreamedBody(t *testing.T) {
	tests := []struct {
		name       string
		size       int
		wantChunks int
	}{
		{name: "an empty body is one empty chunk", size: 0, wantChunks: 1},
		{name: "a body of ChunkSize is one chunk", size: ChunkSize, wantChunks: 1},
		{name: "one byte more makes two chunks", size: ChunkSize + 1, wantChunks: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resps := StreamedBody(make([]byte, tt.size), true)
			assert.Len(t, resps, tt.wantChunks)
			b, eos := streamed(t, resps)
			assert.Len(t, b, tt.size)
			assert.True(t, eos)
		})
	}
}

func TestErrorResponse(t *testing.T) {
	resp := ErrorResponse(429, "sheddable request dropped")
	ir := resp.GetImmediateResponse()
	require.NotNil(t, ir)
	assert.EqualValues(t, 429, ir.GetStatus().GetCode())
	assert.Equal(t, "sheddable request dropped", ir.GetDetails())
	var got ErrorBody
	require.NoError(t, json.Unmarshal(ir.GetBody(), &got))
	assert.Equal(t, ErrorBody{Error: ErrorDetail{Message: "sheddable request dropped", Type: "Too Many Requests", Code: 429}}, got)
	require.Len(t, ir.GetHeaders().GetSetHeaders(), 1)
	assert.Equal(t, "application/json", HeaderValue(ir.GetHeaders().GetSetHeaders()[0].GetHeader()))
}

func TestSubsetHint(t *testing.T) {
	ns := func(v *structpb.Value) *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			SubsetHintNamespace: {Fields: map[string]*structpb.Value{SubsetHintKey: v}},
		}}
	}
	tests := []struct {
		name        string
		md          *corev3.Metadata
		want        []string
		wantPresent bool
		wantErr     bool
	}{
		{name: "no metadata is no hint", md: nil},
		{name: "another namespace is no hint", md: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {}}}},
		{name: "the namespace without the key is no hint", md: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetHintNamespace: {}}}},
		{name: "a list of endpoints", md: SubsetHintMetadata("10.0.0.1:8000", "10.0.0.2:8000"), want: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, wantPresent: true},
		{name: "an empty list allows nothing", md: SubsetHintMetadata(), want: []string{}, wantPresent: true},
		{name: "a comma-separated string", md: ns(structpb.NewStringValue("10.0.0.1:8000, 10.0.0.2:8000")), want: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, wantPresent: true},
		{name: "a number is an error", md: ns(structpb.NewNumberValue(1)), wantPresent: true, wantErr: true},
		{name: "a list with a number is an error", md: ns(structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(1)}})), wantPresent: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, present, err := SubsetHint(tt.md)
			assert.Equal(t, tt.wantPresent, present)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestSplitEndpoints(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{in: "", want: nil},
		{in: "10.0.0.1:8000", want: []string{"10.0.0.1:8000"}},
		{in: " 10.0.0.1:8000 ,,[::1]:8000 ", want: []string{"10.0.0.1:8000", "[::1]:8000"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			assert.Equal(t, tt.want, SplitEndpoints(tt.in))
		})
	}
}

func TestPassThrough(t *testing.T) {
	full := &extprocv3.ProtocolConfiguration{ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	respBody := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("tokens"), EndOfStream: true},
	}}

	t.Run("response headers continue", func(t *testing.T) {
		resp, err := PassThrough(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{}}, nil)
		require.NoError(t, err)
		assert.NotNil(t, resp.GetResponseHeaders())
	})
	t.Run("a response body streams back in full duplex mode", func(t *testing.T) {
		resp, err := PassThrough(respBody, full)
		require.NoError(t, err)
		sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		assert.Equal(t, "tokens", string(sr.GetBody()))
		assert.True(t, sr.GetEndOfStream())
	})
	t.Run("a response body continues unchanged in other modes", func(t *testing.T) {
		resp, err := PassThrough(respBody, nil)
		require.NoError(t, err)
		require.NotNil(t, resp.GetResponseBody())
		assert.Nil(t, resp.GetResponseBody().GetResponse())
	})
	t.Run("response trailers continue", func(t *testing.T) {
		resp, err := PassThrough(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{}}, nil)
		require.NoError(t, err)
		assert.NotNil(t, resp.GetResponseTrailers())
	})
	t.Run("a request message after the request is a protocol violation", func(t *testing.T) {
		_, err := PassThrough(body("x", true), nil)
		assert.ErrorIs(t, err, ErrProtocol)
	})
}

func TestPassThroughResponse(t *testing.T) {
	respHeaders := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{}}
	respTrailers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{}}

	t.Run("the response phase passes through until the gateway ends the stream", func(t *testing.T) {
		stream := &fakeStream{in: []*extprocv3.ProcessingRequest{respHeaders, respTrailers}}
		require.NoError(t, (&Request{}).PassThroughResponse(stream))
		require.Len(t, stream.sent, 2)
		assert.NotNil(t, stream.sent[0].GetResponseHeaders())
		assert.NotNil(t, stream.sent[1].GetResponseTrailers())
	})
	t.Run("a request message after the request is an invalid argument", func(t *testing.T) {
		stream := &fakeStream{in: []*extprocv3.ProcessingRequest{body("x", true)}}
		err := (&Request{}).PassThroughResponse(stream)
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.Empty(t, stream.sent)
	})
	t.Run("a stream error ends it as it is", func(t *testing.T) {
		broken := errors.New("connection reset")
		stream := &fakeStream{in: []*extprocv3.ProcessingRequest{respHeaders}, end: broken}
		assert.ErrorIs(t, (&Request{}).PassThroughResponse(stream), broken)
	})
}
