package extproc

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The names of the Endpoint Picker protocol.
const (
	// DestinationEndpointHeader carries the picked endpoint, "ip:port", or a
	// list "ip:port,ip:port,..." of the primary then its fallbacks.
	DestinationEndpointHeader = "x-gateway-destination-endpoint"
	// DestinationEndpointNamespace and DestinationEndpointKey place the same
	// value in the response's dynamic metadata.
	DestinationEndpointNamespace = "envoy.lb"
	DestinationEndpointKey       = "x-gateway-destination-endpoint"
	// SubsetHintNamespace and SubsetHintKey are where the gateway's filter
	// metadata lists the endpoints a picker must choose from.
	SubsetHintNamespace = "envoy.lb.subset_hint"
	SubsetHintKey       = "x-gateway-destination-endpoint-subset"
	// DestinationEndpointServedKey, in the filter metadata namespace
	// DestinationEndpointNamespace of the response phase's messages, is
	// where the gateway reports the endpoint that served the request (the
	// destination or one of its fallbacks).
	DestinationEndpointServedKey = "x-gateway-destination-endpoint-served"
)

// ChunkSize is the largest body chunk Forward streams back: Envoy
// recommends at most 64 KiB per StreamedBodyResponse.
const ChunkSize = 64 << 10

// Route answers a request read by ReadRequest with its destination:
// endpoints ("ip:port", the primary first, then fallbacks) go, joined with
// commas, into the DestinationEndpointHeader header and the same value into
// the dynamic metadata, as the protocol requires. body is the body to send
// upstream; nil means the request's own. A different body gets a matching
// content-length header.
func (r *Request) Route(endpoints []string, body []byte) []*extprocv3.ProcessingResponse {
	value := strings.Join(endpoints, ",")
	mutation := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{SetHeader(DestinationEndpointHeader, value)}}
	if body == nil {
		body = r.Body
	} else {
		mutation.SetHeaders = append(mutation.SetHeaders, SetHeader("content-length", strconv.Itoa(len(body))))
	}
	return r.Forward(mutation, DestinationMetadata(value), body)
}

// Forward answers a request read by ReadRequest: the headers response with
// mutation and dynamicMetadata (either may be nil), then, if the request has
// a body, body streamed back in chunks, then, if trailers ended the request,
// an empty trailers response. The route cache is cleared so that the
// gateway's routing sees the mutated headers.
func (r *Request) Forward(mutation *extprocv3.HeaderMutation, dynamicMetadata *structpb.Struct, body []byte) []*extprocv3.ProcessingResponse {
	resps := make([]*extprocv3.ProcessingResponse, 0, 2+len(body)/ChunkSize)
	resps = append(resps, &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: true},
		}},
		DynamicMetadata: dynamicMetadata,
	})
	if !r.hasBody {
		return resps
	}
	resps = append(resps, StreamedBody(body, !r.endedByTrailers)...)
	if r.endedByTrailers {
		resps = append(resps, &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}},
		})
	}
	return resps
}

// StreamedBody returns request body responses that stream body back in
// chunks of at most ChunkSize, the last carrying endOfStream. An empty body
// is one empty chunk.
func StreamedBody(body []byte, endOfStream bool) []*extprocv3.ProcessingResponse {
	resps := make([]*extprocv3.ProcessingResponse, 0, 1+len(body)/ChunkSize)
	for {
		n := min(len(body), ChunkSize)
		last := n == len(body)
		resps = append(resps, &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
						Body:        body[:n],
						EndOfStream: last && endOfStream,
					}},
				}},
			}},
		})
		body = body[n:]
		if last {
			return resps
		}
	}
}

// SetHeader returns a header mutation that sets name to value, replacing any
// value the request already has (Envoy's default action appends, which would
// let a caller's own header ride along).
func SetHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// DestinationMetadata returns the dynamic metadata that carries a
// destination value: {"envoy.lb": {"x-gateway-destination-endpoint": value}}.
func DestinationMetadata(value string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		DestinationEndpointNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationEndpointKey: structpb.NewStringValue(value),
		}}),
	}}
}

// ErrorBody is the JSON body of an ErrorResponse, in the shape of an OpenAI
// API error so that OpenAI clients show the message.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the "error" member of an ErrorBody.
type ErrorDetail struct {
	// Message says what went wrong, for a person.
	Message string `json:"message"`
	// Type is the HTTP status text ("Too Many Requests").
	Type string `json:"type"`
	// Code is the HTTP status code.
	Code int `json:"code"`
}

// ErrorResponse returns an immediate response with an HTTP status code and a
// JSON ErrorBody, which the gateway sends to the client instead of
// forwarding the request. The message also goes into the response's details,
// which Envoy can log.
func ErrorResponse(code int, message string) *extprocv3.ProcessingResponse {
	body, err := json.Marshal(ErrorBody{Error: ErrorDetail{Message: message, Type: http.StatusText(code), Code: code}})
	if err != nil {
		// A struct of strings and an int always marshals.
		panic(fmt.Sprintf("marshaling an error body: %v", err))
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				SetHeader("content-type", "application/json"),
			}},
			Body:    body,
			Details: message,
		}},
	}
}

// PassThrough answers a message of the response phase (headers, body or
// trailers of the upstream response) by letting it through unchanged: a
// gateway configured to send the response to the picker as well then sees no
// difference. In the FULL_DUPLEX_STREAMED response body mode (announced in
// cfg) a body chunk has to be streamed back; in the other modes an empty
// answer continues. It returns an ErrProtocol error for a message of the
// request phase.
func PassThrough(msg *extprocv3.ProcessingRequest, cfg *extprocv3.ProtocolConfiguration) (*extprocv3.ProcessingResponse, error) {
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{},
		}}, nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		resp := &extprocv3.BodyResponse{}
		if cfg.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			resp.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
					Body:        r.ResponseBody.GetBody(),
					EndOfStream: r.ResponseBody.GetEndOfStream(),
				}},
			}}
		}
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}}, nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{},
		}}, nil
	default:
		return nil, fmt.Errorf("%w: got %s after the request was answered", ErrProtocol, kind(msg))
	}
}

// EndsResponse says whether msg is the last message of the response phase
// a gateway sends: response headers that end the stream, the body chunk
// that does, or the response trailers.
func EndsResponse(msg *extprocv3.ProcessingRequest) bool {
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		return r.ResponseBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return true
	}
	return false
}

// PassThroughResponse answers the rest of the stream of a request already
// answered, the response phase of a gateway configured to send it as well,
// with PassThrough until the gateway ends the stream. A message PassThrough
// refuses ends the stream with an InvalidArgument status.
func (r *Request) PassThroughResponse(stream Stream) error {
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := PassThrough(msg, r.ProtocolConfig)
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// SendAll sends resps in order, stopping at the first error.
func SendAll(stream Stream, resps []*extprocv3.ProcessingResponse) error {
	for _, resp := range resps {
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
	return nil
}
