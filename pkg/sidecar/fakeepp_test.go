package sidecar

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// What a fake EPP does with a request.
const (
	eppRoute       int32 = iota // answer with its destination
	eppFail                     // end the stream with an error before answering
	eppHang                     // never answer
	eppUnavailable              // answer 503: its pool has no endpoint
	eppShed                     // answer 429
)

// What a fake EPP does in the response phase.
const (
	respPass      int32 = iota // let it through, marking the response headers
	respFail                   // fail the stream once the response headers arrive
	respHang                   // never answer the response headers
	respEnd                    // end the stream once the response headers arrive
	respImmediate              // answer the response headers with an immediate 502
	respSlowEnd                // answer everything, then end its stream only when reset
	respHoldBody               // hold its answers to body chunks until the body ends (an EPP that reads the usage at the end)
	respRewrite                // stream each body chunk back upper-cased (an EPP that rewrites bodies)
	respStallBody              // answer the response headers, then nothing more until reset (a stalled link)
)

// fakeEPP is a minimal Endpoint Picker on 127.0.0.1: it routes every
// request to its own destination and says so in a header, or misbehaves on
// demand.
type fakeEPP struct {
	name, dest string
	mode       atomic.Int32
	calls      atomic.Int64
	// rewriteModel, when set, is the model its answers rewrite the
	// body's to: its exporter's model rewrite.
	rewriteModel atomic.Pointer[string]
	addr         string
	srv          *grpc.Server

	mu       sync.Mutex
	subsets  []bool // whether each request carried a subset hint
	lastBody []byte
	// relayed is the extproc.RelayedHeader of each request ("" without one).
	relayed []string
	// paths are the :path of each request.
	paths []string

	// respMode is what it does in the response phase.
	respMode atomic.Int32
	// responses counts the response-phase messages it got, served the
	// served reports, ends how its streams ended after the request phase
	// ("eof", "canceled", or the mode that ended it).
	responses atomic.Int64
	served    []string
	ends      []string
	// chunks are the response body chunks it got, in order.
	chunks []string
	// frames are the bytes of every message it read, as they came.
	frames [][]byte
}

// frameLog is a fake EPP's codec: protobuf's, noting the bytes of every
// message it reads.
type frameLog struct{ f *fakeEPP }

var protoCodec = encoding.GetCodecV2("proto")

func (c frameLog) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

func (c frameLog) Unmarshal(data mem.BufferSlice, v any) error {
	c.f.mu.Lock()
	c.f.frames = append(c.f.frames, data.Materialize())
	c.f.mu.Unlock()
	return protoCodec.Unmarshal(data, v)
}

func (frameLog) Name() string { return protoCodec.Name() }

func (f *fakeEPP) framesOf() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.frames)
}

func (f *fakeEPP) chunksOf() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.chunks...)
}

func (f *fakeEPP) endsOf() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ends...)
}

func (f *fakeEPP) ended(how string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends = append(f.ends, how)
}

// respond answers the response phase as respMode says; in every mode the
// response headers get the header x-response-seen-by.
func (f *fakeEPP) respond(stream extprocv3.ExternalProcessor_ProcessServer, req *extproc.Request) error {
	var held []*extprocv3.ProcessingResponse
	for {
		msg, err := stream.Recv()
		if err == io.EOF && f.respMode.Load() == respSlowEnd {
			// As an EPP behind a slow link: its end of stream comes too
			// late for the gateway, which resets the stream first.
			<-stream.Context().Done()
			f.ended("slow end")
			return stream.Context().Err()
		}
		if err == io.EOF {
			f.ended("eof")
			return nil
		}
		if err != nil {
			f.ended("canceled")
			return err
		}
		f.responses.Add(1)
		if served := extproc.ServedEndpoint(msg.GetMetadataContext()); served != "" && msg.GetResponseHeaders() != nil {
			f.mu.Lock()
			f.served = append(f.served, served)
			f.mu.Unlock()
		}
		if msg.GetResponseHeaders() != nil {
			switch f.respMode.Load() {
			case respFail:
				f.ended("fail")
				return status.Error(codes.Internal, "picker exploded in the response phase")
			case respHang:
				<-stream.Context().Done()
				f.ended("hang")
				return stream.Context().Err()
			case respEnd:
				f.ended("end")
				return nil
			case respImmediate:
				f.ended("immediate")
				return stream.Send(extproc.ErrorResponse(http.StatusBadGateway, "the response is no good"))
			}
			if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("x-response-seen-by", f.name)}}},
			}}}); err != nil {
				return err
			}
			continue
		}
		resp, err := extproc.PassThrough(msg, req.ProtocolConfig)
		if err != nil {
			return err
		}
		if f.respMode.Load() == respStallBody {
			<-stream.Context().Done()
			f.ended("stall")
			return stream.Context().Err()
		}
		if b := msg.GetResponseBody(); b != nil {
			f.mu.Lock()
			f.chunks = append(f.chunks, string(b.GetBody()))
			f.mu.Unlock()
			switch f.respMode.Load() {
			case respRewrite:
				sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				sr.Body = bytes.ToUpper(sr.Body)
			case respHoldBody:
				if held = append(held, resp); !b.GetEndOfStream() {
					continue
				}
				if err := extproc.SendAll(stream, held); err != nil {
					return err
				}
				held = nil
				continue
			}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (f *fakeEPP) lastPath() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.paths) == 0 {
		return ""
	}
	return f.paths[len(f.paths)-1]
}

func startFakeEPP(t *testing.T, name, dest string) *fakeEPP {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeEPP{name: name, dest: dest, addr: lis.Addr().String()}
	f.srv = grpc.NewServer(grpc.ForceServerCodecV2(frameLog{f}))
	extprocv3.RegisterExternalProcessorServer(f.srv, f)
	go func() { _ = f.srv.Serve(lis) }()
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeEPP) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	f.calls.Add(1)
	req, err := extproc.ReadRequest(stream, 0)
	if err != nil {
		return err
	}
	_, hasSubset, _ := extproc.SubsetHint(req.Metadata)
	f.mu.Lock()
	f.subsets = append(f.subsets, hasSubset)
	f.lastBody = req.Body
	f.relayed = append(f.relayed, req.Header(extproc.RelayedHeader))
	f.paths = append(f.paths, req.Header(":path"))
	f.mu.Unlock()
	switch f.mode.Load() {
	case eppFail:
		return status.Error(codes.Internal, "picker exploded")
	case eppHang:
		<-stream.Context().Done()
		return stream.Context().Err()
	case eppUnavailable:
		return stream.Send(extproc.ErrorResponse(http.StatusServiceUnavailable, "no ready endpoints in "+f.name))
	case eppShed:
		return stream.Send(extproc.ErrorResponse(http.StatusTooManyRequests, "shed by "+f.name))
	}
	mutation := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		extproc.SetHeader(extproc.DestinationEndpointHeader, f.dest),
		extproc.SetHeader("x-picked-by", f.name),
	}}
	body := req.Body
	if model := f.rewriteModel.Load(); model != nil {
		parsed, err := requestmodel.ParseBody(body)
		if err != nil {
			return err
		}
		body = parsed.WithModel(*model)
	}
	if err := extproc.SendAll(stream, req.Forward(mutation, extproc.DestinationMetadata(f.dest), body)); err != nil {
		return err
	}
	return f.respond(stream, req)
}

func hostPort(t testing.TB, addr string) (string, int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return h, int32(n)
}
