// Package extproc is the Envoy ext_proc v3 plumbing shared by the Endpoint
// Picker (pkg/epp) and the multi-cluster sidecar: reading the request phase of
// a Process stream into its headers and whole body, and building the answers
// of the Endpoint Picker protocol (a destination in a header and in dynamic
// metadata, a rewritten body, an immediate error).
//
// It speaks the processing mode the Inference Gateway configures: request
// headers SEND, request body FULL_DUPLEX_STREAMED (with request trailers
// SEND, which that mode requires). In that mode the gateway streams the body
// without waiting for the headers response and forwards upstream only the
// body the server streams back. A picker therefore buffers the whole body,
// decides, and then answers the headers and streams the body back, in that
// order (Request.Forward). The BUFFERED and STREAMED body modes are not
// supported: in them the gateway waits for the headers response before it
// sends the body, which a picker that needs the body cannot give.
//
// Servers runs such a server the way both commands serve it: ext_proc, gRPC
// health and Prometheus metrics on the ports of ServingOptions, drained at
// shutdown.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Stream is the server side of a Process stream; the stream a gRPC
// ExternalProcessorServer is given satisfies it.
type Stream interface {
	Context() context.Context
	Send(*extprocv3.ProcessingResponse) error
	Recv() (*extprocv3.ProcessingRequest, error)
}

var (
	// ErrBodyTooLarge means the request body grew past the limit given to
	// ReadRequest. Answer it with ErrorResponse(413, ...).
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrProtocol means the gateway sent a message that the processing mode
	// does not allow at that point of the stream.
	ErrProtocol = errors.New("ext_proc protocol violation")
)

// maxPrealloc bounds the body buffer allocated from a content-length.
const maxPrealloc = 1 << 20

// Request is the request phase of one Process stream, read whole.
type Request struct {
	// Headers are the request headers by lower-case name, pseudo-headers
	// (":method", ":path", ":authority") included, each with its values in
	// the order the gateway sent them.
	Headers map[string][]string
	// Body is the whole request body, nil when the request has none. It is
	// read only: a body that came in one chunk shares that message's bytes.
	Body []byte
	// Metadata is the metadata_context of the first message that carried
	// one: the filter metadata the gateway forwards, such as the subset hint.
	Metadata *corev3.Metadata
	// ProtocolConfig is what the gateway announced in its first message; nil
	// from gateways that do not announce it.
	ProtocolConfig *extprocv3.ProtocolConfiguration

	// hasBody: the headers did not end the stream, so the gateway expects
	// the body back. endedByTrailers: trailers, not a body chunk, ended it.
	hasBody, endedByTrailers bool
}

// Header returns the first value of the named header, "" when absent. The
// name is case-insensitive.
func (r *Request) Header(name string) string {
	if v := r.Headers[strings.ToLower(name)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// ReadRequest reads the request headers and then, unless the headers end the
// stream, buffers body chunks until one carries end_of_stream or the
// trailers arrive. A body growing past maxBody bytes (maxBody > 0) stops the
// reading with ErrBodyTooLarge; the returned Request then holds the headers
// and metadata but no body. Errors of the stream itself (the gateway went
// away, the context ended) are returned as they are, io.EOF in the middle of
// a request as io.ErrUnexpectedEOF.
func ReadRequest(stream Stream, maxBody int64) (*Request, error) {
	msg, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	h := msg.GetRequestHeaders()
	if h == nil {
		return nil, fmt.Errorf("%w: the stream starts with %s, want request headers", ErrProtocol, kind(msg))
	}
	req := &Request{
		Headers:        HeaderMapToMap(h.GetHeaders()),
		Metadata:       msg.GetMetadataContext(),
		ProtocolConfig: msg.GetProtocolConfig(),
		hasBody:        !h.GetEndOfStream(),
	}
	if !req.hasBody {
		return req, nil
	}
	// A body in more than one chunk announcing its length gets one
	// allocation; up to a bound, so that a false announcement costs little.
	var prealloc int64
	if n, err := strconv.ParseInt(req.Header("content-length"), 10, 64); err == nil && n > 0 && (maxBody <= 0 || n <= maxBody) {
		prealloc = min(n, maxPrealloc)
	}
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil, io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, err
		}
		if req.Metadata == nil {
			req.Metadata = msg.GetMetadataContext()
		}
		switch r := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			chunk := r.RequestBody.GetBody()
			if maxBody > 0 && int64(len(req.Body))+int64(len(chunk)) > maxBody {
				req.Body = nil
				return req, ErrBodyTooLarge
			}
			if req.Body == nil && r.RequestBody.GetEndOfStream() {
				// A body in one chunk, as most are, is that chunk's bytes,
				// not a copy: a request's body is only read.
				req.Body = chunk
				if req.Body == nil {
					req.Body = []byte{}
				}
				return req, nil
			}
			if req.Body == nil && prealloc > 0 {
				req.Body = make([]byte, 0, prealloc)
			}
			req.Body = append(req.Body, chunk...)
			if r.RequestBody.GetEndOfStream() {
				if req.Body == nil {
					req.Body = []byte{}
				}
				return req, nil
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			req.endedByTrailers = true
			if req.Body == nil {
				req.Body = []byte{}
			}
			return req, nil
		default:
			return nil, fmt.Errorf("%w: got %s while reading the request body", ErrProtocol, kind(msg))
		}
	}
}

// HeaderMapToMap turns an ext_proc header map into values by lower-case
// name. A header's raw_value wins over its value, as in Envoy.
func HeaderMapToMap(hm *corev3.HeaderMap) map[string][]string {
	hs := hm.GetHeaders()
	// Every request goes through here: the values share one string and
	// their slices one array, instead of an allocation of each per header.
	size := 0
	for _, h := range hs {
		size += valueLen(h)
	}
	var b strings.Builder
	b.Grow(size)
	for _, h := range hs {
		if raw := h.GetRawValue(); len(raw) > 0 {
			b.Write(raw)
		} else {
			b.WriteString(h.GetValue())
		}
	}
	all := b.String()
	values := make([]string, len(hs))
	headers := make(map[string][]string, len(hs))
	for i, h := range hs {
		n := valueLen(h)
		values[i], all = all[:n], all[n:]
		name := strings.ToLower(h.GetKey())
		if prev, ok := headers[name]; ok {
			// A repeated header: the capacity of one below makes this
			// append copy rather than overwrite the next header's value.
			headers[name] = append(prev, values[i])
			continue
		}
		headers[name] = values[i : i+1 : i+1]
	}
	return headers
}

// valueLen is the length of what HeaderValue returns.
func valueLen(h *corev3.HeaderValue) int {
	if n := len(h.GetRawValue()); n > 0 {
		return n
	}
	return len(h.GetValue())
}

// HeaderValue returns a header's raw_value, or its value when raw_value is
// empty.
func HeaderValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// kind names the message a ProcessingRequest carries, for errors.
func kind(msg *extprocv3.ProcessingRequest) string {
	switch msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "request headers"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "a request body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "request trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "response headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "a response body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "response trailers"
	default:
		return "an empty message"
	}
}
