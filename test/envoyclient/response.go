package envoyclient

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/mci-dev/mci/pkg/extproc"
)

// Response is an upstream response as the gateway hands it to ext_proc in
// the response phase.
type Response struct {
	// Status is ":status"; default 200.
	Status int
	// Headers are the response headers.
	Headers http.Header
	// Body is the response body; BodyReader, when set, is used instead and
	// streamed chunk by chunk as it is read, the way Envoy passes on a
	// body still arriving (a model server's streamed tokens): a reader
	// that blocks holds the exchange in the middle of the response.
	Body       []byte
	BodyReader io.Reader
	// ChunkSize is the size of the body chunks sent; default
	// DefaultChunkSize.
	ChunkSize int
	// Trailers, when not nil, end the response after the body. Read only
	// once the body has been read, so a proxy may fill them from its
	// upstream's trailers meanwhile.
	Trailers http.Header
	// Served is the endpoint the gateway reports as having served the
	// request; default: the destination of the request phase.
	Served string
	// Metadata is more filter metadata the gateway forwards with each
	// message of the response phase, beside the endpoint that served.
	Metadata *corev3.Metadata
}

// ResponseResult is what the ext_proc server made of a Response.
type ResponseResult struct {
	// Immediate is set when the server replaced the response with an
	// immediate response.
	Immediate *ImmediateResponse
	// Status, Headers, Body and Trailers are the response as the gateway
	// passes it on: mutated by the server, the body as it streamed it back.
	Status   int
	Headers  http.Header
	Body     []byte
	Trailers http.Header
}

// ResponseSink receives a response as the gateway passes it on to its
// client.
type ResponseSink interface {
	// WriteHeaders gets the status and headers once the server has
	// answered them, before any of the body.
	WriteHeaders(status int, h http.Header) error
	// WriteBody gets each piece of the body the server streams back.
	WriteBody(chunk []byte) error
	// WriteTrailers gets the trailers once the server has answered them.
	WriteTrailers(h http.Header) error
}

// Respond runs the response phase of the exchange as Envoy does with the
// Inference Gateway's processing mode: the response headers (with the
// served endpoint in the metadata_context, under envoy.lb as the Endpoint
// Picker protocol says), then, without waiting for their answer
// (FULL_DUPLEX_STREAMED), the body in chunks, then the trailers if the
// response has any (the last chunk then carries no end_of_stream). It
// passes the server's answers to sink as they come: the headers once
// answered, the body as the server streams it back, the trailers once
// answered. The message timeout applies to the answer of the headers and
// trailers and, once the whole body is sent, to the rest of the body: a
// server may hold a body until its end. It returns the server's immediate
// response if it sent one, and an error when the stream fails or the server
// breaks the protocol; Close or Reset the exchange after.
//
// A mode_override of the server is ignored, as Envoy ignores them with a
// FULL_DUPLEX_STREAMED body mode.
func (x *Exchange) Respond(resp Response, sink ResponseSink) (*ImmediateResponse, error) {
	served := cmp.Or(resp.Served, x.Result.Destination)
	md := extproc.ServedMetadata(served)
	for ns, v := range resp.Metadata.GetFilterMetadata() {
		if ns != extproc.DestinationEndpointNamespace {
			md.FilterMetadata[ns] = v
		}
	}
	status := cmp.Or(resp.Status, http.StatusOK)
	headers := http.Header{}
	for k, vs := range resp.Headers {
		headers[k] = append([]string(nil), vs...)
	}
	headers.Set(":status", strconv.Itoa(status))
	hasBody := resp.BodyReader != nil || len(resp.Body) > 0

	var (
		mu          sync.Mutex
		sentAll     bool
		hasTrailers bool
		trailers    http.Header
		sendErr     error
		// pending is the body sent and not streamed back yet; bypass: the
		// server closed its stream, and the rest of the response goes to
		// the sink unchanged.
		pending [][]byte
		bypass  bool
	)
	// The sender: headers, body, trailers, as they come. A reset stream
	// does not wait for one blocked reading a BodyReader: it ends when the
	// reader returns.
	sent := make(chan struct{})
	done := sent
	if resp.BodyReader != nil {
		done = nil
	}
	go func() {
		defer close(sent)
		err := func() error {
			// A send fails with io.EOF once the server has closed its
			// stream: the receiver then passes on what was sent and the
			// rest goes around the server.
			if err := x.stream.Send(&extprocv3.ProcessingRequest{
				Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
					Headers: toHeaderMap(headers), EndOfStream: !hasBody && resp.Trailers == nil,
				}},
				MetadataContext: md,
			}); err != nil && err != io.EOF {
				return err
			}
			if hasBody {
				err := streamChunks(resp.Body, resp.BodyReader, resp.ChunkSize, func(chunk []byte, last bool) error {
					mu.Lock()
					defer mu.Unlock()
					if bypass {
						return sink.WriteBody(chunk)
					}
					pending = append(pending, chunk)
					err := x.stream.Send(&extprocv3.ProcessingRequest{
						Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: last && resp.Trailers == nil}},
						MetadataContext: md,
					})
					if err == io.EOF {
						return nil
					}
					return err
				})
				if err != nil {
					return err
				}
			}
			if resp.Trailers != nil {
				mu.Lock()
				hasTrailers, trailers = true, resp.Trailers.Clone()
				by := bypass
				mu.Unlock()
				if by {
					return sink.WriteTrailers(trailers)
				}
				if err := x.stream.Send(&extprocv3.ProcessingRequest{
					Request:         &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: toHeaderMap(trailers)}},
					MetadataContext: md,
				}); err != nil && err != io.EOF {
					return err
				}
			}
			return nil
		}()
		mu.Lock()
		sentAll, sendErr = true, err
		mu.Unlock()
		if err == nil {
			// From now on every answer is waited for.
			x.armWatchdog()
		}
	}()

	// The receiver.
	x.armWatchdog()
	gotHeaders, bodyDone := false, !hasBody
	trailersDone := resp.Trailers == nil
	for !gotHeaders || !bodyDone || !trailersDone {
		msg, err := x.stream.Recv()
		if err == io.EOF {
			// The server closed its stream: as Envoy, the gateway skips
			// the rest of the processing and passes the rest of the
			// response on unchanged.
			mu.Lock()
			bypass = true
			err := func() error {
				if !gotHeaders {
					h := headers.Clone()
					h.Del(":status")
					if err := sink.WriteHeaders(status, h); err != nil {
						return err
					}
				}
				for _, b := range pending {
					if err := sink.WriteBody(b); err != nil {
						return err
					}
				}
				pending = nil
				if hasTrailers && !trailersDone {
					return sink.WriteTrailers(trailers)
				}
				return nil
			}()
			mu.Unlock()
			if err != nil {
				return nil, x.fail(done, err)
			}
			<-sent
			x.stopWatchdog()
			mu.Lock()
			defer mu.Unlock()
			return nil, sendErr
		}
		if err != nil {
			_ = x.fail(done, err)
			if x.timedOut.Load() {
				return nil, ErrMessageTimeout
			}
			return nil, fmt.Errorf("ext_proc stream in the response phase: %w", err)
		}
		mu.Lock()
		waitAll := sentAll
		mu.Unlock()
		if waitAll {
			x.gotMessage()
		}
		switch r := msg.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			_ = x.fail(done, nil)
			return immediate(r.ImmediateResponse), nil
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			if gotHeaders {
				return nil, x.violation(done, "a second response headers response")
			}
			gotHeaders = true
			if !waitAll {
				// The body is still coming: the server may hold it.
				x.stopWatchdog()
			}
			applyMutation(headers, r.ResponseHeaders.GetResponse().GetHeaderMutation())
			st, err := strconv.Atoi(headers.Get(":status"))
			if err != nil {
				return nil, x.violation(done, fmt.Sprintf("response :status %q", headers.Get(":status")))
			}
			h := headers.Clone()
			h.Del(":status")
			if err := sink.WriteHeaders(st, h); err != nil {
				return nil, x.fail(done, err)
			}
		case *extprocv3.ProcessingResponse_ResponseBody:
			if !gotHeaders {
				return nil, x.violation(done, "a response body response before the response headers response")
			}
			if bodyDone {
				return nil, x.violation(done, "a response body response after the end of the body")
			}
			sr := r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return nil, x.violation(done, "a FULL_DUPLEX_STREAMED response body response without a streamed_response")
			}
			mu.Lock()
			for n := len(sr.GetBody()); n > 0 && len(pending) > 0; {
				if n < len(pending[0]) {
					pending[0] = pending[0][n:]
					break
				}
				n -= len(pending[0])
				pending = pending[1:]
			}
			mu.Unlock()
			if len(sr.GetBody()) > 0 {
				if err := sink.WriteBody(sr.GetBody()); err != nil {
					return nil, x.fail(done, err)
				}
			}
			bodyDone = sr.GetEndOfStream()
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			mu.Lock()
			ht, tr := hasTrailers, trailers
			mu.Unlock()
			if !ht || trailersDone {
				return nil, x.violation(done, "a response trailers response without trailers")
			}
			applyMutation(tr, r.ResponseTrailers.GetHeaderMutation())
			if err := sink.WriteTrailers(tr); err != nil {
				return nil, x.fail(done, err)
			}
			bodyDone, trailersDone = true, true
		default:
			return nil, x.violation(done, fmt.Sprintf("unexpected %T during the response phase", msg.Response))
		}
	}
	x.stopWatchdog()
	<-sent
	mu.Lock()
	defer mu.Unlock()
	return nil, sendErr
}

// violation resets the stream for a protocol violation of the server, as
// Envoy does.
func (x *Exchange) violation(done <-chan struct{}, what string) error {
	return x.fail(done, errors.New("protocol violation: "+what))
}

// fail resets the stream and waits for the sender (done nil: not).
func (x *Exchange) fail(done <-chan struct{}, err error) error {
	x.cancel()
	if done != nil {
		<-done
	}
	return err
}

// recordingSink keeps a response whole.
type recordingSink struct {
	status            int
	headers, trailers http.Header
	body              []byte
}

func (s *recordingSink) WriteHeaders(status int, h http.Header) error {
	s.status, s.headers = status, h
	return nil
}

func (s *recordingSink) WriteBody(chunk []byte) error {
	s.body = append(s.body, chunk...)
	return nil
}

func (s *recordingSink) WriteTrailers(h http.Header) error {
	s.trailers = h
	return nil
}
