package envoyclient

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mci-dev/mci/pkg/extproc"
)

// requestHeaders returns the headers Envoy would send for req. Keys are
// canonical, as http.Header wants them; pseudo-headers stay as they are
// (http.CanonicalHeaderKey leaves ":path" alone), so Get works for both.
func requestHeaders(req Request) http.Header {
	h := http.Header{}
	h.Set(":method", cmp.Or(req.Method, http.MethodPost))
	h.Set(":path", cmp.Or(req.Path, "/"))
	h.Set(":authority", cmp.Or(req.Authority, "mci-gateway"))
	h.Set(":scheme", "http")
	for k, vs := range req.Headers {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	if req.BodyReader != nil || len(req.Body) > 0 {
		if h.Get("content-type") == "" {
			h.Set("content-type", "application/json")
		}
		if req.BodyReader == nil && h.Get("content-length") == "" {
			h.Set("content-length", strconv.Itoa(len(req.Body)))
		}
	}
	return h
}

func toHeaderMap(h http.Header) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for k, vs := range h {
		for _, v := range vs {
			// Envoy sends raw_value, not value.
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	return hm
}

// sendBody sends the body in chunks, end_of_stream on the last.
func sendBody(stream extprocv3.ExternalProcessor_ProcessClient, req Request) error {
	return streamChunks(req.Body, req.BodyReader, req.ChunkSize, func(chunk []byte, last bool) error {
		return stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: last},
		}})
	})
}

// streamChunks cuts body, or what r yields when it is not nil, into
// chunks of at most size (default DefaultChunkSize) and hands them to send
// in order, the last one (empty when r ends after its data) with last set. A reader's error ends it, as Envoy resets the stream when the
// body it passes on fails.
func streamChunks(body []byte, r io.Reader, size int, send func(chunk []byte, last bool) error) error {
	if size <= 0 {
		size = DefaultChunkSize
	}
	if r == nil {
		for {
			n := min(size, len(body))
			if err := send(body[:n], n == len(body)); err != nil {
				return err
			}
			if body = body[n:]; len(body) == 0 {
				return nil
			}
		}
	}
	buf := make([]byte, size)
	for {
		// What has arrived goes on at once, as Envoy passes on a body
		// still arriving (a model server's streamed tokens).
		n, err := r.Read(buf)
		switch {
		case err == io.EOF:
			return send(append([]byte(nil), buf[:n]...), true)
		case err != nil:
			return err
		case n == 0:
			continue
		}
		if err := send(append([]byte(nil), buf[:n]...), false); err != nil {
			return err
		}
	}
}

// receive reads the server's answers to the request phase.
// gotMessage is called on each message, to rearm the message timeout.
func receive(stream extprocv3.ExternalProcessor_ProcessClient, headers http.Header, hasBody bool, gotMessage func()) (*Result, error) {
	res := &Result{Headers: headers}
	gotHeaders, bodyDone := false, !hasBody
	for !gotHeaders || !bodyDone {
		resp, err := stream.Recv()
		if err != nil {
			return res, fmt.Errorf("ext_proc stream: %w", err)
		}
		gotMessage()
		mergeMetadata(res, resp.GetDynamicMetadata())
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			res.Immediate = immediate(r.ImmediateResponse)
			return res, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if gotHeaders {
				return res, errors.New("protocol violation: a second request headers response")
			}
			gotHeaders = true
			common := r.RequestHeaders.GetResponse()
			if common.GetBodyMutation() != nil {
				return res, errors.New("protocol violation: a body mutation in the headers response of a FULL_DUPLEX_STREAMED request")
			}
			applyMutation(res.Headers, common.GetHeaderMutation())
		case *extprocv3.ProcessingResponse_RequestBody:
			if !gotHeaders {
				return res, errors.New("protocol violation: a request body response before the request headers response")
			}
			if bodyDone {
				return res, errors.New("protocol violation: a request body response after end_of_stream")
			}
			common := r.RequestBody.GetResponse()
			applyMutation(res.Headers, common.GetHeaderMutation())
			sr := common.GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return res, errors.New("protocol violation: a FULL_DUPLEX_STREAMED request body response without a streamed_response")
			}
			res.Body = append(res.Body, sr.GetBody()...)
			bodyDone = sr.GetEndOfStream()
		default:
			return res, fmt.Errorf("protocol violation: unexpected %T during the request phase", resp.Response)
		}
	}
	return res, destination(res)
}

// destination fills Destination and Fallbacks from the header and the
// dynamic metadata, which the protocol requires to agree.
func destination(res *Result) error {
	header := res.Headers.Get(extproc.DestinationEndpointHeader)
	meta := extproc.DestinationFromMetadata(res.DynamicMetadata)
	if header != "" && meta != "" && header != meta {
		return fmt.Errorf("protocol violation: destination header %q and dynamic metadata %q differ", header, meta)
	}
	if header == "" {
		header = meta
	}
	if eps := extproc.SplitEndpoints(header); len(eps) > 0 {
		res.Destination, res.Fallbacks = eps[0], eps[1:]
	}
	return nil
}

// mergeMetadata merges md into the result's dynamic metadata, namespace by
// namespace, as Envoy does.
func mergeMetadata(res *Result, md *structpb.Struct) {
	if md == nil {
		return
	}
	if res.DynamicMetadata == nil {
		res.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for ns, v := range md.GetFields() {
		old := res.DynamicMetadata.Fields[ns].GetStructValue()
		if old == nil || v.GetStructValue() == nil {
			res.DynamicMetadata.Fields[ns] = v
			continue
		}
		for k, kv := range v.GetStructValue().GetFields() {
			old.Fields[k] = kv
		}
	}
}

// applyMutation applies a header mutation with Envoy's append actions.
func applyMutation(h http.Header, m *extprocv3.HeaderMutation) {
	for _, opt := range m.GetSetHeaders() {
		key := http.CanonicalHeaderKey(opt.GetHeader().GetKey())
		value := extproc.HeaderValue(opt.GetHeader())
		if value == "" && !opt.GetKeepEmptyValue() {
			continue
		}
		action := opt.GetAppendAction()
		if opt.GetAppend() != nil {
			// The deprecated field wins when set.
			action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
			if opt.GetAppend().GetValue() {
				action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
			}
		}
		_, exists := h[key]
		switch action {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h[key] = append(h[key], value)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h[key] = []string{value}
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h[key] = []string{value}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h[key] = []string{value}
			}
		}
	}
	for _, k := range m.GetRemoveHeaders() {
		h.Del(k)
	}
}

func immediate(ir *extprocv3.ImmediateResponse) *ImmediateResponse {
	code := int(ir.GetStatus().GetCode())
	if code == 0 {
		// Envoy's default for an immediate response without a status.
		code = http.StatusOK
	}
	h := http.Header{}
	applyMutation(h, ir.GetHeaders())
	return &ImmediateResponse{StatusCode: code, Headers: h, Body: ir.GetBody(), Details: ir.GetDetails()}
}
