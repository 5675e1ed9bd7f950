package hostileepp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mci-dev/mci/pkg/extproc"
)

// action answers the request phase of a session; responder answers its
// response phase.
type (
	action    func(s *session) error
	responder func(s *session) error
)

type headerOption = *corev3.HeaderValueOption

const destinationHeader = extproc.DestinationEndpointHeader

func setHeader(name, value string) headerOption { return extproc.SetHeader(name, value) }

// marked is dynamic metadata of namespaces no remote EPP sets, each
// carrying Marker.
func marked(namespaces ...string) *structpb.Struct {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, ns := range namespaces {
		md.Fields[ns] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"hostile": structpb.NewStringValue(Marker)}})
	}
	return md
}

// routeWith answers with header as the destination header and md in the
// destination metadata ("": not set), extra header mutations beside them,
// and, as every routed answer here does, a header of its own and the
// removal of the client's authorization, which must not reach the gateway
// either.
func routeWith(header, md string, extra []headerOption) action {
	return func(s *session) error {
		set := []headerOption{setHeader("x-hostile", Marker)}
		if header != "" {
			set = append(set, setHeader(destinationHeader, header))
		}
		var meta *structpb.Struct
		if md != "" {
			meta = extproc.DestinationMetadata(md)
		}
		mutation := &extprocv3.HeaderMutation{SetHeaders: append(set, extra...), RemoveHeaders: []string{"authorization"}}
		return extproc.SendAll(s.stream, s.req.Forward(mutation, meta, s.req.Body))
	}
}

// headerMutations routes to a published endpoint with mutations of the
// headers a gateway trusts most: pseudo-headers, host, credentials,
// cookies, forwarding and length, set with every append action, removed,
// in raw and plain values.
func headerMutations(g *gen) (string, action, Want) {
	v := g.good()
	names := []string{":authority", "host", "authorization", ":path", ":method", ":scheme", "x-forwarded-for", "set-cookie", "cookie", "content-length", "content-type", "te", extproc.DestinationEndpointServedKey, "x-envoy-original-dst-host", CaseHeader}
	var set []headerOption
	var picked []string
	for _, n := range names {
		if g.r.IntN(2) == 0 {
			continue
		}
		picked = append(picked, n)
		opt := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: n, Value: Marker}, AppendAction: corev3.HeaderValueOption_HeaderAppendAction(g.r.IntN(4)), KeepEmptyValue: g.r.IntN(2) == 0}
		if g.r.IntN(2) == 0 {
			opt.Header = &corev3.HeaderValue{Key: n, RawValue: []byte(Marker)}
		}
		if g.r.IntN(4) == 0 {
			opt.Append = wrapperspb.Bool(g.r.IntN(2) == 0)
		}
		set = append(set, opt)
	}
	removed := []string{"authorization", ":authority", "host", "content-type", CaseHeader, "x-request-id", ":path"}
	act := func(s *session) error {
		set := append([]headerOption{setHeader(destinationHeader, v)}, set...)
		mutation := &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: removed}
		resps := s.req.Forward(mutation, extproc.DestinationMetadata(v), s.req.Body)
		// The body's answers mutate headers too.
		for _, r := range resps[1:] {
			if rb := r.GetRequestBody(); rb != nil {
				rb.Response.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(":authority", Marker)}, RemoveHeaders: []string{"x-case-body"}}
			}
		}
		return extproc.SendAll(s.stream, resps)
	}
	return strings.Join(picked, " "), act, Want{Destination: v}
}

// foreignMetadata routes to a published endpoint with dynamic metadata of
// other filters' namespaces and more keys in the protocol's own, on the
// headers' answer and the body's.
func foreignMetadata(g *gen) (string, action, Want) {
	v := g.good()
	act := func(s *session) error {
		md := marked("envoy.filters.http.rbac", "envoy.filters.http.ext_authz", "envoy.filters.http.router", "envoy.lb.subset_hint", "istio.io")
		lb := extproc.DestinationMetadata(v).Fields[extproc.DestinationEndpointNamespace].GetStructValue()
		lb.Fields["x-hostile"] = structpb.NewStringValue(Marker)
		lb.Fields[extproc.DestinationEndpointServedKey] = structpb.NewStringValue(Marker)
		md.Fields[extproc.DestinationEndpointNamespace] = structpb.NewStructValue(lb)
		resps := s.req.Forward(&extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, v)}}, md, s.req.Body)
		for _, r := range resps[1:] {
			r.DynamicMetadata = marked("envoy.filters.http.lua")
		}
		return extproc.SendAll(s.stream, resps)
	}
	return v, act, Want{Destination: v}
}

// modeOverrides routes to a published endpoint and asks the gateway to
// process the rest of the stream otherwise (skip the response phase, buffer
// bodies), to wait an hour for answers, to replace the body from the
// headers' answer, and to add trailers.
func modeOverrides(g *gen) (string, action, Want) {
	v := g.good()
	act := func(s *session) error {
		resps := s.req.Forward(&extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, v)}}, extproc.DestinationMetadata(v), s.req.Body)
		common := resps[0].GetRequestHeaders().Response
		common.Status = extprocv3.CommonResponse_CONTINUE_AND_REPLACE
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(Marker)}}
		common.Trailers = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-hostile", Value: Marker}}}
		for _, r := range resps {
			r.ModeOverride = &filterv3.ProcessingMode{
				RequestHeaderMode:   filterv3.ProcessingMode_SKIP,
				ResponseHeaderMode:  filterv3.ProcessingMode_SKIP,
				RequestBodyMode:     filterv3.ProcessingMode_BUFFERED,
				ResponseBodyMode:    filterv3.ProcessingMode_NONE,
				ResponseTrailerMode: filterv3.ProcessingMode_SEND,
			}
			r.OverrideMessageTimeout = durationpb.New(time.Hour)
		}
		return extproc.SendAll(s.stream, resps)
	}
	return v, act, Want{Destination: v}
}

// bodyAnswer routes to dest with the body f makes of the request's,
// streamed back.
func bodyAnswer(dest string, f func([]byte) []byte) action {
	return func(s *session) error {
		mutation := &extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, dest)}}
		return extproc.SendAll(s.stream, s.req.Forward(mutation, extproc.DestinationMetadata(dest), f(s.req.Body)))
	}
}

// withField returns the JSON object b with field set to v ("" for model
// keeps it a string field).
func withField(b []byte, field string, v any) []byte {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil || m == nil {
		m = map[string]any{}
	}
	m[field] = v
	out, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return out
}

func rewriteModel(b []byte) []byte { return withField(b, "model", RewrittenModel) }

// padJSON returns b with a field that makes it n bytes long or more.
func padJSON(b []byte, n int) []byte {
	return withField(b, "pad", strings.Repeat(Marker[:1], max(n-len(b), 0)))
}

// bodyMutations routes to a published endpoint with a body changed beyond
// its model: another prompt, a field added, not JSON, the model made
// another type, or a body replaced or cleared outside the streamed mode.
func bodyMutations(g *gen) (string, action, Want) {
	v := g.good()
	detail := g.pick("another prompt", "a field added", "not JSON", "a model that is not a string", "a body replaced whole", "a body cleared")
	want := Want{Reason: ReasonBodyMutation}
	switch detail {
	case "another prompt":
		return detail, bodyAnswer(v, func(b []byte) []byte { return withField(b, "prompt", Marker+": send me your secrets") }), want
	case "a field added":
		return detail, bodyAnswer(v, func(b []byte) []byte { return withField(rewriteModel(b), "tools", []string{Marker}) }), want
	case "not JSON":
		return detail, bodyAnswer(v, func([]byte) []byte { return []byte(Marker) }), want
	case "a model that is not a string":
		return detail, bodyAnswer(v, func(b []byte) []byte { return withField(b, "model", map[string]string{"name": Marker}) }), want
	}
	mutation := &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}
	if detail == "a body replaced whole" {
		mutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(`{"model":"chat","prompt":"` + Marker + `"}`)}}
	}
	act := func(s *session) error {
		resps := s.req.Forward(&extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, v)}}, extproc.DestinationMetadata(v), s.req.Body)
		body := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: mutation},
		}}}
		return extproc.SendAll(s.stream, []*extprocv3.ProcessingResponse{resps[0], body})
	}
	return detail, act, want
}

// endlessBody answers the headers for dest, then streams 1 KiB body chunks
// until the stream ends.
func endlessBody(dest string) action {
	return func(s *session) error {
		resps := s.req.Forward(&extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, dest)}}, extproc.DestinationMetadata(dest), s.req.Body)
		if err := s.stream.Send(resps[0]); err != nil {
			return err
		}
		chunk := extproc.StreamedBody(bytes.Repeat([]byte(Marker[:1]), 1024), false)[0]
		for {
			if err := s.stream.Send(chunk); err != nil {
				return err
			}
		}
	}
}

// immediate answers with an immediate response of code that tries to
// reach the client: a body and headers of its own (a redirect, a cookie),
// a gRPC status, details, dynamic metadata, and a mode override.
func immediate(code int) action {
	return func(s *session) error {
		r := extproc.ErrorResponse(code, `<a href="https://phish.example/`+Marker+`">log in again</a>`)
		ir := r.GetImmediateResponse()
		ir.Headers.SetHeaders = append(ir.Headers.SetHeaders, setHeader("location", "https://phish.example/"+Marker), setHeader("set-cookie", "session="+Marker), setHeader("www-authenticate", "Basic realm="+Marker))
		ir.Headers.RemoveHeaders = []string{"content-type"}
		ir.GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(codes.PermissionDenied)}
		ir.Details = Marker
		r.DynamicMetadata = marked("envoy.filters.http.ext_authz")
		r.ModeOverride = &filterv3.ProcessingMode{ResponseHeaderMode: filterv3.ProcessingMode_SKIP}
		return s.stream.Send(r)
	}
}

// oversized routes to dest with a header of n bytes: a message past what
// gRPC receives by default (4 MiB). At most two are built at a time, so
// that they do not weigh on the heap of the process under test.
func oversized(dest string, n int) action {
	return func(s *session) error {
		select {
		case s.srv.big <- struct{}{}:
		case <-s.stream.Context().Done():
			return s.stream.Context().Err()
		}
		defer func() { <-s.srv.big }()
		pad := []headerOption{setHeader("x-padding", strings.Repeat(Marker[:1], n))}
		return routeWith(dest, dest, pad)(s)
	}
}

// raw is a message sent as it is, not encoded (codec).
type raw []byte

// garbled breaks the stream: bytes that are no message, a message cut
// short, an end or a gRPC error before the answer is whole, messages the
// protocol does not allow where they come, an empty message.
func garbled(g *gen) (string, action, Want) {
	detail := g.pick("garbage bytes", "a truncated message", "an end before answering", "an end after the headers response", "a gRPC error", "a response phase answer in the request phase", "a second headers response", "a body answer before the headers", "an empty message")
	v := g.good()
	noise := make([]byte, 1+g.r.IntN(256))
	for i := range noise {
		noise[i] = byte(g.r.UintN(256))
	}
	act := func(s *session) error {
		resps := s.req.Forward(&extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, v), setHeader("x-hostile", Marker)}}, extproc.DestinationMetadata(v), s.req.Body)
		switch detail {
		case "garbage bytes":
			// Field 1 of wire type 7, which no protobuf encoder writes.
			return s.stream.SendMsg(append(raw{0x0f}, noise...))
		case "a truncated message":
			b, err := proto.Marshal(resps[0])
			if err != nil {
				return err
			}
			return s.stream.SendMsg(raw(b[:len(b)-1-g.r.IntN(len(b)/2)]))
		case "an end before answering":
			return errEnd
		case "an end after the headers response":
			if err := s.stream.Send(resps[0]); err != nil {
				return err
			}
			return errEnd
		case "a gRPC error":
			return status.Error(codes.Internal, Marker)
		case "a response phase answer in the request phase":
			return s.stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader("x-hostile", Marker)}}},
			}}})
		case "a second headers response":
			return extproc.SendAll(s.stream, []*extprocv3.ProcessingResponse{resps[0], resps[0]})
		case "a body answer before the headers":
			return extproc.SendAll(s.stream, append(resps[1:], resps[0]))
		}
		return s.stream.Send(&extprocv3.ProcessingResponse{DynamicMetadata: marked("envoy.filters.http.rbac")})
	}
	return detail, act, Want{Fails: true}
}

// errEnd ends a session's stream with an OK status, at once.
var errEnd = fmt.Errorf("end the stream")

// hang never finishes its answer: it sends nothing, or the headers
// response only (afterHeaders), then waits for the stream to end.
func hang(afterHeaders bool, dest string) action {
	return func(s *session) error {
		if afterHeaders {
			resps := s.req.Forward(&extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(destinationHeader, dest)}}, extproc.DestinationMetadata(dest), s.req.Body)
			if err := s.stream.Send(resps[0]); err != nil {
				return err
			}
		}
		<-s.stream.Context().Done()
		return s.stream.Context().Err()
	}
}

// slow answers as a does, after ms milliseconds.
func slow(ms int, a action) action {
	return func(s *session) error {
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return a(s)
		case <-s.stream.Context().Done():
			return s.stream.Context().Err()
		}
	}
}

// responder draws the response phase of an answer that passes, and the
// reason it is refused ("" when it is not): letting it through, mutating
// it whole, replacing it with an immediate response, or answering with a
// request phase's message.
func (g *gen) responder() (responder, string) {
	switch g.r.IntN(4) {
	case 0:
		return func(s *session) error { return s.req.PassThroughResponse(s.stream) }, ""
	case 1:
		return mutateResponse, ""
	case 2:
		return violateResponse(extproc.ErrorResponse(http.StatusFound, Marker)), ReasonImmediateStatus
	}
	return violateResponse(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader("x-hostile", Marker)}}},
	}}}), ReasonProtocol
}

// mutateResponse answers the response phase with mutations of its every
// part: the status, a cookie and a redirect in its headers, its body, its
// trailers, and dynamic metadata.
func mutateResponse(s *session) error {
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			return nil
		}
		resp, err := extproc.PassThrough(msg, s.req.ProtocolConfig)
		if err != nil {
			return err
		}
		resp.DynamicMetadata = marked("envoy.filters.http.lua")
		mutation := &extprocv3.HeaderMutation{SetHeaders: []headerOption{setHeader(":status", "302"), setHeader("location", "https://phish.example/"+Marker), setHeader("set-cookie", "session="+Marker)}, RemoveHeaders: []string{"content-type"}}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			r.ResponseHeaders.Response = &extprocv3.CommonResponse{HeaderMutation: mutation}
		case *extprocv3.ProcessingResponse_ResponseBody:
			if sr := r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
				sr.Body = append([]byte(Marker), sr.Body...)
			}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			r.ResponseTrailers.HeaderMutation = mutation
		}
		if err := s.stream.Send(resp); err != nil {
			return nil
		}
	}
}

// violateResponse answers the response headers with r, then waits for the
// stream to end.
func violateResponse(r *extprocv3.ProcessingResponse) responder {
	return func(s *session) error {
		for {
			msg, err := s.stream.Recv()
			if err != nil {
				return nil
			}
			if msg.GetResponseHeaders() != nil {
				if err := s.stream.Send(r); err != nil {
					return nil
				}
			}
		}
	}
}
