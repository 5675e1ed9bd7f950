package responserelay

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mci-dev/mci/pkg/extproc"
)

// sentStream is a gateway stream that keeps what is sent to it.
type sentStream struct {
	extproc.Stream
	sent []*extprocv3.ProcessingResponse
}

func (s *sentStream) Send(r *extprocv3.ProcessingResponse) error {
	s.sent = append(s.sent, r)
	return nil
}

func (s *sentStream) SendMsg(m any) error {
	return s.Send(m.(*extproc.ResponseFrame).ProcessingResponse)
}

func (s *sentStream) RecvMsg(any) error { panic("not read in these tests") }

var (
	duplexMode   = &extprocv3.ProtocolConfiguration{ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	streamedMode = &extprocv3.ProtocolConfiguration{ResponseBodyMode: filterv3.ProcessingMode_STREAMED}
	bufferedMode = &extprocv3.ProtocolConfiguration{ResponseBodyMode: filterv3.ProcessingMode_BUFFERED}

	gwHeaders  = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}
	gwTrailers = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}

	eppHeaders = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	// eppHeadersMutated is the EPP's answer to the response headers
	// setting a header ("headers+" once the gateway has it).
	eppHeadersMutated = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("x-seen", "epp")}}},
	}}}
	eppBody     = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	eppTrailers = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
)

func gwChunk(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func eppStreamedBack(b string, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(b), EndOfStream: eos}}},
	}}}}
}

// describe names the answers the gateway got: "headers" ("headers+" with a
// header mutation), "body:<bytes>[:eos]", "body" (a plain body answer),
// "trailers".
func describe(resps []*extprocv3.ProcessingResponse) []string {
	var out []string
	for _, r := range resps {
		switch {
		case r.GetResponseHeaders() != nil:
			d := "headers"
			if r.GetResponseHeaders().GetResponse().GetHeaderMutation() != nil {
				d += "+"
			}
			out = append(out, d)
		case r.GetResponseBody() != nil:
			sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				out = append(out, "body")
				continue
			}
			d := "body:" + string(sr.GetBody())
			if sr.GetEndOfStream() {
				d += ":eos"
			}
			out = append(out, d)
		case r.GetResponseTrailers() != nil:
			out = append(out, "trailers")
		}
	}
	return out
}

func TestTakeOverAnswersWhatTheEPPOwedInOrder(t *testing.T) {
	tests := []struct {
		name    string
		cfg     *extprocv3.ProtocolConfiguration
		ahead   bool
		gateway []*extprocv3.ProcessingRequest
		epp     []*extprocv3.ProcessingResponse
		// want is what takeOver sends.
		want []string
	}{
		{
			name:    "nothing answered yet: the headers, then the whole body",
			cfg:     duplexMode,
			gateway: []*extprocv3.ProcessingRequest{gwHeaders, gwChunk("hello ", false), gwChunk("world", true)},
			want:    []string{"headers", "body:hello world:eos"},
		},
		{
			name:    "the body bytes the EPP did not stream back",
			cfg:     duplexMode,
			gateway: []*extprocv3.ProcessingRequest{gwHeaders, gwChunk("hello ", false), gwChunk("world", true)},
			epp:     []*extprocv3.ProcessingResponse{eppHeaders, eppStreamedBack("hello w", false)},
			want:    []string{"body:orld:eos"},
		},
		{
			name:    "a body ended by trailers: its rest without end_of_stream, then the trailers",
			cfg:     duplexMode,
			gateway: []*extprocv3.ProcessingRequest{gwHeaders, gwChunk("abc", false), gwTrailers},
			epp:     []*extprocv3.ProcessingResponse{eppHeaders, eppStreamedBack("a", false)},
			want:    []string{"body:bc", "trailers"},
		},
		{
			name:    "everything answered: nothing",
			cfg:     duplexMode,
			gateway: []*extprocv3.ProcessingRequest{gwHeaders, gwChunk("abc", true)},
			epp:     []*extprocv3.ProcessingResponse{eppHeaders, eppStreamedBack("abc", true)},
		},
		{
			name:    "other body modes: one answer per chunk",
			gateway: []*extprocv3.ProcessingRequest{gwHeaders, gwChunk("a", false), gwChunk("b", true)},
			epp:     []*extprocv3.ProcessingResponse{eppHeaders},
			want:    []string{"body", "body"},
		},
		{
			name:    "chunks that went ahead: the headers, the chunks held for them, the trailers; never a chunk twice",
			cfg:     duplexMode,
			ahead:   true,
			gateway: []*extprocv3.ProcessingRequest{gwHeaders, gwChunk("abc", false), gwTrailers},
			want:    []string{"headers", "body:abc", "trailers"},
		},
		{
			name:    "chunks that went ahead after the EPP answered the headers: only the trailers",
			cfg:     duplexMode,
			ahead:   true,
			gateway: []*extprocv3.ProcessingRequest{gwHeaders},
			epp:     []*extprocv3.ProcessingResponse{eppHeaders},
			want:    []string{"trailers"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newPhaseRelay(Config{Protocol: tt.cfg, Ahead: tt.ahead, Timeout: time.Minute}, nil, func(error) {})
			defer o.stop()
			gw := &sentStream{}
			for _, m := range tt.gateway {
				forward, err := o.fromGateway(m, gw)
				require.NoError(t, err)
				require.True(t, forward)
			}
			for _, r := range tt.epp {
				_, err := o.fromEPP(&extproc.ResponseFrame{ProcessingResponse: r}, gw)
				require.NoError(t, err)
			}
			if tt.ahead && len(tt.epp) > 0 {
				// The rest of the body goes ahead; the trailers are owed.
				_, err := o.fromGateway(gwChunk("more", false), gw)
				require.NoError(t, err)
				_, err = o.fromGateway(gwTrailers, gw)
				require.NoError(t, err)
			}
			gw.sent = nil
			assert.True(t, o.owing() || len(tt.want) == 0)
			require.NoError(t, o.takeOver(gw))
			assert.Equal(t, tt.want, describe(gw.sent))
			assert.False(t, o.owing())

			// From now on the sidecar answers the gateway itself.
			gw.sent = nil
			forward, err := o.fromGateway(gwTrailers, gw)
			require.NoError(t, err)
			assert.False(t, forward)
			assert.Equal(t, []string{"trailers"}, describe(gw.sent))
		})
	}
}

// step is a message of the gateway (gw) or an answer of the EPP (epp) in
// the response phase.
type step struct {
	gw  *extprocv3.ProcessingRequest
	epp *extprocv3.ProcessingResponse
}

func withMetadata(r *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	r.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{"usage": structpb.NewNumberValue(7)}}
	return r
}

func TestStreamedBodyChunksGoToTheGatewayWithoutWaitingForTheEPP(t *testing.T) {
	rewrite := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("other")}},
	}}}}
	headerInBody := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("x-usage", "7")}},
	}}}}
	tests := []struct {
		name  string
		cfg   *extprocv3.ProtocolConfiguration
		ahead bool
		steps []step
		// want is what the gateway got, in order; wantLate and wantWhat
		// the EPP's answers that could not be applied.
		want     []string
		wantLate int
		wantWhat string
	}{
		{
			name: "duplex: a chunk goes at once, one before the EPP's headers answer right after it, the EPP's echo is not sent again",
			cfg:  duplexMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {gw: gwChunk("tok1 ", false)},
				{epp: eppHeadersMutated},
				{gw: gwChunk("tok2 ", false)}, {gw: gwChunk("tok3", true)},
				{epp: eppStreamedBack("tok1 tok", false)}, {epp: eppStreamedBack("2 tok3", true)},
			},
			want: []string{"headers+", "body:tok1 ", "body:tok2 ", "body:tok3:eos"},
		},
		{
			name: "duplex: an EPP that holds the body to its end delays nothing",
			cfg:  duplexMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders},
				{gw: gwChunk("a", false)}, {gw: gwChunk("b", false)}, {gw: gwChunk("", true)},
				{epp: eppStreamedBack("ab", true)},
			},
			want: []string{"headers", "body:a", "body:b", "body::eos"},
		},
		{
			name: "duplex: the trailers wait for the EPP's answer",
			cfg:  duplexMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("a", false)}, {gw: gwTrailers},
				{epp: eppStreamedBack("a", false)}, {epp: eppTrailers},
			},
			want: []string{"headers", "body:a", "trailers"},
		},
		{
			name: "duplex: a body the EPP rewrote arrives late: the chunks went on unchanged, counted",
			cfg:  duplexMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("abc", true)},
				{epp: eppStreamedBack("ABC", true)},
			},
			want:     []string{"headers", "body:abc:eos"},
			wantLate: 1, wantWhat: "a rewritten body",
		},
		{
			name: "duplex: an EPP that streams back more than it got rewrote the body",
			cfg:  duplexMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("abc", true)},
				{epp: eppStreamedBack("abc and more", true)},
			},
			want:     []string{"headers", "body:abc:eos"},
			wantLate: 1, wantWhat: "a rewritten body",
		},
		{
			name: "streamed: each chunk is answered with an empty answer at once",
			cfg:  streamedMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("a", false)}, {gw: gwChunk("b", true)},
				{epp: eppBody}, {epp: eppBody},
			},
			want: []string{"headers", "body", "body"},
		},
		{
			name: "streamed: a header mutation in a chunk's answer arrives late",
			cfg:  streamedMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("a", true)}, {epp: headerInBody},
			},
			want:     []string{"headers", "body"},
			wantLate: 1, wantWhat: "a header mutation",
		},
		{
			name: "streamed: a body mutation arrives late",
			cfg:  streamedMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("a", false)}, {epp: rewrite}, {gw: gwChunk("b", true)}, {epp: rewrite},
			},
			want:     []string{"headers", "body", "body"},
			wantLate: 2, wantWhat: "a body mutation",
		},
		{
			name: "duplex: dynamic metadata in a chunk's answer arrives late",
			cfg:  duplexMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("a", true)},
				{epp: withMetadata(eppStreamedBack("a", true))},
			},
			want:     []string{"headers", "body:a:eos"},
			wantLate: 1, wantWhat: "dynamic metadata",
		},
		{
			name: "buffered: the body comes whole and waits for the EPP, whose mutation applies",
			cfg:  bufferedMode, ahead: true,
			steps: []step{
				{gw: gwHeaders}, {epp: eppHeaders}, {gw: gwChunk("abc", true)}, {epp: rewrite},
			},
			want: []string{"headers", "body"},
		},
		{
			name: "Intercept: every chunk waits for the EPP, whose rewrite applies",
			cfg:  duplexMode,
			steps: []step{
				{gw: gwHeaders}, {gw: gwChunk("abc", true)}, {epp: eppHeaders}, {epp: eppStreamedBack("ABC", true)},
			},
			want: []string{"headers", "body:ABC:eos"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newPhaseRelay(Config{Protocol: tt.cfg, Ahead: tt.ahead, Timeout: time.Minute}, nil, func(error) {})
			defer o.stop()
			gw := &sentStream{}
			for _, s := range tt.steps {
				if s.gw != nil {
					forward, err := o.fromGateway(s.gw, gw)
					require.NoError(t, err)
					require.True(t, forward, "every message goes to the EPP")
					continue
				}
				immediate, err := o.fromEPP(&extproc.ResponseFrame{ProcessingResponse: s.epp}, gw)
				require.NoError(t, err)
				require.False(t, immediate)
			}
			assert.Equal(t, tt.want, describe(gw.sent))
			assert.False(t, o.owing(), "the EPP answered everything")
			late, what := o.lateAnswers()
			assert.Equal(t, tt.wantLate, late)
			assert.Equal(t, tt.wantWhat, what)
		})
	}
}
