package envoyclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mci-dev/mci/pkg/extproc"
)

// scripted is an ext_proc server whose Process is the test's function.
type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	process func(extprocv3.ExternalProcessor_ProcessServer) error
}

func (s *scripted) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return s.process(stream)
}

func serve(t *testing.T, opts Options, process func(extprocv3.ExternalProcessor_ProcessServer) error) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, &scripted{process: process})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := Dial(lis.Addr().String(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func do(t *testing.T, c *Client, req Request) (*Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, req)
}

func TestDoSpeaksFullDuplexStreamed(t *testing.T) {
	var got []*extprocv3.ProcessingRequest
	c := serve(t, Options{}, func(stream extprocv3.ExternalProcessor_ProcessServer) error {
		req, err := extproc.ReadRequest(recorder{stream, &got}, 0)
		if err != nil {
			return err
		}
		return extproc.SendAll(stream, req.Route([]string{"10.0.0.1:8000", "10.0.0.2:8000"}, []byte(`{"model":"b"}`)))
	})

	res, err := do(t, c, Request{
		Path:      "/v1/completions",
		Headers:   http.Header{"X-Caller": {"me"}},
		Body:      []byte(`{"model":"a","prompt":"0123456789"}`),
		ChunkSize: 10,
		Metadata:  extproc.SubsetHintMetadata("10.0.0.1:8000"),
	})
	require.NoError(t, err)
	require.Nil(t, res.Immediate)
	assert.Equal(t, "10.0.0.1:8000", res.Destination)
	assert.Equal(t, []string{"10.0.0.2:8000"}, res.Fallbacks)
	assert.Equal(t, `{"model":"b"}`, string(res.Body))
	assert.Equal(t, "13", res.Headers.Get("content-length"))
	assert.Equal(t, "me", res.Headers.Get("x-caller"))
	assert.Equal(t, "/v1/completions", res.Headers.Get(":path"))

	require.Len(t, got, 5, "headers, then 4 chunks of at most 10 bytes")
	first := got[0]
	assert.Equal(t, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, first.GetProtocolConfig().GetRequestBodyMode())
	assert.False(t, first.GetRequestHeaders().GetEndOfStream())
	headers := extproc.HeaderMapToMap(first.GetRequestHeaders().GetHeaders())
	for name, want := range map[string]string{":method": "POST", ":path": "/v1/completions", ":authority": "mci-gateway", "content-type": "application/json", "content-length": "35", "x-caller": "me"} {
		assert.Equal(t, []string{want}, headers[name], name)
	}
	for _, h := range first.GetRequestHeaders().GetHeaders().GetHeaders() {
		assert.Empty(t, h.GetValue(), "Envoy sends raw_value")
		assert.Equal(t, strings.ToLower(h.GetKey()), h.GetKey(), "header names go lower-case")
	}
	hint, present, err := extproc.SubsetHint(first.GetMetadataContext())
	require.NoError(t, err)
	assert.True(t, present)
	assert.Equal(t, []string{"10.0.0.1:8000"}, hint)
	for i, m := range got[1:] {
		assert.LessOrEqual(t, len(m.GetRequestBody().GetBody()), 10)
		assert.Equal(t, i == 3, m.GetRequestBody().GetEndOfStream(), "end_of_stream on the last chunk only")
	}
}

// recorder records what a stream receives.
type recorder struct {
	extprocv3.ExternalProcessor_ProcessServer
	got *[]*extprocv3.ProcessingRequest
}

func (r recorder) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := r.ExternalProcessor_ProcessServer.Recv()
	if err == nil {
		*r.got = append(*r.got, m)
	}
	return m, err
}

func TestDoReportsImmediateResponsesAndProtocolViolations(t *testing.T) {
	headersResponse := func(h *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: h}},
		}}
	}
	tests := []struct {
		name string
		// answer runs after the first message (the headers) is read.
		answer        func(stream extprocv3.ExternalProcessor_ProcessServer) error
		opts          Options
		wantImmediate int
		wantErr       string
		wantErrIs     error
	}{
		{
			name: "an immediate response in the middle of the body is reported as such",
			answer: func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				return stream.Send(extproc.ErrorResponse(413, "too large"))
			},
			wantImmediate: 413,
		},
		{
			name: "a body response before the headers response is a protocol violation",
			answer: func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				_ = drain(stream)
				return extproc.SendAll(stream, extproc.StreamedBody([]byte("x"), true))
			},
			wantErr: "before the request headers response",
		},
		{
			name: "a header and metadata that disagree are a protocol violation",
			answer: func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				_ = drain(stream)
				resp := headersResponse(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader(extproc.DestinationEndpointHeader, "10.0.0.1:8000")}})
				resp.DynamicMetadata = extproc.DestinationMetadata("10.0.0.2:8000")
				return extproc.SendAll(stream, append([]*extprocv3.ProcessingResponse{resp}, extproc.StreamedBody([]byte("{}"), true)...))
			},
			wantErr: "differ",
		},
		{
			name: "a buffered body mutation is a protocol violation in FULL_DUPLEX_STREAMED",
			answer: func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				_ = drain(stream)
				return extproc.SendAll(stream, []*extprocv3.ProcessingResponse{headersResponse(nil), {Response: &extprocv3.ProcessingResponse_RequestBody{
					RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("x")}}}},
				}}})
			},
			wantErr: "without a streamed_response",
		},
		{
			name: "a server that does not answer in time: message timeout",
			opts: Options{MessageTimeout: 50 * time.Millisecond},
			answer: func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				<-stream.Context().Done()
				return nil
			},
			wantErrIs: ErrMessageTimeout,
		},
		{
			name: "a server error ends the request with an error",
			answer: func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				return errors.New("boom")
			},
			wantErr: "boom",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := serve(t, tt.opts, func(stream extprocv3.ExternalProcessor_ProcessServer) error {
				if _, err := stream.Recv(); err != nil {
					return err
				}
				return tt.answer(stream)
			})
			res, err := do(t, c, Request{Body: []byte(`{"model":"a"}`), ChunkSize: 4})
			switch {
			case tt.wantErrIs != nil:
				require.ErrorIs(t, err, tt.wantErrIs)
			case tt.wantErr != "":
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
			default:
				require.NoError(t, err)
				require.NotNil(t, res.Immediate)
				assert.Equal(t, tt.wantImmediate, res.Immediate.StatusCode)
				assert.Equal(t, "application/json", res.Immediate.Headers.Get("content-type"))
			}
		})
	}
}

// drain reads the request body until end_of_stream.
func drain(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if m.GetRequestBody().GetEndOfStream() {
			return nil
		}
	}
}

func TestApplyMutation(t *testing.T) {
	opt := func(k, v string, action corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}, AppendAction: action}
	}
	tests := []struct {
		name string
		opt  *corev3.HeaderValueOption
		want []string
	}{
		{name: "append if exists or add appends", opt: opt("x", "new", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD), want: []string{"old", "new"}},
		{name: "add if absent keeps a present value", opt: opt("x", "new", corev3.HeaderValueOption_ADD_IF_ABSENT), want: []string{"old"}},
		{name: "overwrite if exists or add replaces", opt: opt("X", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD), want: []string{"new"}},
		{name: "overwrite if exists replaces a present value", opt: opt("x", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS), want: []string{"new"}},
		{name: "the deprecated append=false overwrites", opt: &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x", Value: "new"}, Append: wrapperspb.Bool(false)}, want: []string{"new"}},
		{name: "an empty value is dropped unless kept", opt: opt("x", "", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD), want: []string{"old"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"X": {"old"}}
			applyMutation(h, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{tt.opt}})
			assert.Equal(t, tt.want, h.Values("x"))
		})
	}
	t.Run("remove deletes", func(t *testing.T) {
		h := http.Header{"X": {"old"}}
		applyMutation(h, &extprocv3.HeaderMutation{RemoveHeaders: []string{"x"}})
		assert.Empty(t, h.Values("x"))
	})
	t.Run("overwrite if exists does not add", func(t *testing.T) {
		h := http.Header{}
		applyMutation(h, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("x", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS)}})
		assert.Empty(t, h.Values("x"))
	})
}

func TestProxy(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Path", r.URL.RequestURI())
		w.Header().Set("X-Mutated", r.Header.Get("X-Mutated"))
		_, _ = w.Write(b)
	}))
	defer upstream.Close()
	// A port nothing listens on: the connection is refused.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := dead.Addr().String()
	require.NoError(t, dead.Close())

	c := serve(t, Options{}, func(stream extprocv3.ExternalProcessor_ProcessServer) error {
		req, err := extproc.ReadRequest(stream, 0)
		if err != nil {
			return err
		}
		if req.Header("x-refuse") != "" {
			return stream.Send(extproc.ErrorResponse(429, "shed"))
		}
		resps := req.Route([]string{deadAddr, upstream.Listener.Addr().String()}, []byte(`{"model":"rewritten"}`))
		resps[0].GetRequestHeaders().Response.HeaderMutation.SetHeaders = append(resps[0].GetRequestHeaders().Response.HeaderMutation.SetHeaders, extproc.SetHeader("x-mutated", "yes"))
		return extproc.SendAll(stream, resps)
	})
	gw := httptest.NewServer(NewProxy(c, nil))
	defer gw.Close()

	t.Run("the request goes to the first destination that accepts a connection, as the server left it", func(t *testing.T) {
		resp, err := http.Post(gw.URL+"/v1/completions?a=b", "application/json", strings.NewReader(`{"model":"original"}`))
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		assert.Equal(t, `{"model":"rewritten"}`, string(b))
		assert.Equal(t, "/v1/completions?a=b", resp.Header.Get("X-Path"))
		assert.Equal(t, "yes", resp.Header.Get("X-Mutated"))
	})
	t.Run("an immediate response goes back to the caller", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("X-Refuse", "1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Contains(t, string(b), "shed")
	})
}

// TestRespondSpeaksTheResponsePhase checks the response phase as Envoy
// drives it with the Inference Gateway's processing mode: the response
// headers with the served report, the body in FULL_DUPLEX_STREAMED
// chunks, the trailers, each answer applied.
func TestRespondSpeaksTheResponsePhase(t *testing.T) {
	var got []*extprocv3.ProcessingRequest
	c := serve(t, Options{MessageTimeout: 2 * time.Second}, func(stream extprocv3.ExternalProcessor_ProcessServer) error {
		req, err := extproc.ReadRequest(stream, 0)
		if err != nil {
			return err
		}
		if err := extproc.SendAll(stream, req.Route([]string{"10.0.0.1:8000"}, nil)); err != nil {
			return err
		}
		assert.Equal(t, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, req.ProtocolConfig.GetResponseBodyMode())
		for {
			msg, err := stream.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			got = append(got, msg)
			var resp *extprocv3.ProcessingResponse
			switch r := msg.Request.(type) {
			case *extprocv3.ProcessingRequest_ResponseHeaders:
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("x-epp", "seen")}}},
				}}}
			case *extprocv3.ProcessingRequest_ResponseBody:
				// Upper-cased, to show that the body streamed back is what
				// goes on.
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
					Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
						StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(strings.ToUpper(string(r.ResponseBody.GetBody()))), EndOfStream: r.ResponseBody.GetEndOfStream()},
					}}},
				}}}
			case *extprocv3.ProcessingRequest_ResponseTrailers:
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("x-usage", "7")}},
				}}}
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	})

	res, err := do(t, c, Request{Path: "/v1/completions", Body: []byte(`{"model":"a"}`), Response: &Response{
		Headers: http.Header{"Content-Type": {"application/json"}}, Body: []byte("hello world"), ChunkSize: 4,
		Trailers: http.Header{"X-Trailer": {"t"}},
	}})
	require.NoError(t, err)
	require.NotNil(t, res.Response)
	assert.Equal(t, http.StatusOK, res.Response.Status)
	assert.Equal(t, "seen", res.Response.Headers.Get("X-Epp"))
	assert.Equal(t, "HELLO WORLD", string(res.Response.Body))
	assert.Equal(t, "7", res.Response.Trailers.Get("X-Usage"))
	assert.Equal(t, "t", res.Response.Trailers.Get("X-Trailer"))

	var kinds []string
	for _, m := range got {
		assert.Equal(t, "10.0.0.1:8000", extproc.ServedEndpoint(m.GetMetadataContext()), "every message reports the endpoint that served")
		switch r := m.Request.(type) {
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			kinds = append(kinds, "headers")
			assert.False(t, r.ResponseHeaders.GetEndOfStream())
		case *extprocv3.ProcessingRequest_ResponseBody:
			kinds = append(kinds, "body")
			assert.False(t, r.ResponseBody.GetEndOfStream(), "trailers end the response, not the body")
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			kinds = append(kinds, "trailers")
		}
	}
	assert.Equal(t, []string{"headers", "body", "body", "body", "trailers"}, kinds)
}

// TestRespondPassesTheRestOnWhenTheServerEndsItsStream: as Envoy, a server
// that closes its stream ends the processing; the response goes on.
func TestRespondPassesTheRestOnWhenTheServerEndsItsStream(t *testing.T) {
	c := serve(t, Options{}, func(stream extprocv3.ExternalProcessor_ProcessServer) error {
		req, err := extproc.ReadRequest(stream, 0)
		if err != nil {
			return err
		}
		return extproc.SendAll(stream, req.Route([]string{"10.0.0.1:8000"}, nil))
	})
	res, err := do(t, c, Request{Path: "/v1/completions", Body: []byte(`{"model":"a"}`), Response: &Response{Status: 201, Body: []byte("unchanged"), ChunkSize: 3}})
	require.NoError(t, err)
	assert.Equal(t, 201, res.Response.Status)
	assert.Equal(t, "unchanged", string(res.Response.Body))
}
