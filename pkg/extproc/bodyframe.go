package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Body chunks, of the request and of the response, are most of a
// stream's bytes. Decoded as protobuf, a chunk's body is copied out of the
// frame's bytes, which the frame keeps as well (Raw, to send on as they
// are): the body was held twice. A chunk that is nothing but its body and
// end of stream, as gateways send them, is read here instead, its body the
// very bytes of Raw within it; any other message (another field, a field
// twice, an unknown one, anything malformed) is left to proto.Unmarshal,
// which decodes it as before.
// Nobody writes into a frame's bytes (a relay that changes a message
// drops Raw), so the two sharing them is safe.

// Field numbers of the messages read in place, from their descriptors.
var (
	requestBodyField  = fieldNumber(&extprocv3.ProcessingRequest{}, "request_body")
	responseBodyField = fieldNumber(&extprocv3.ProcessingRequest{}, "response_body")
	bodyField         = fieldNumber(&extprocv3.HttpBody{}, "body")
	endOfStreamField  = fieldNumber(&extprocv3.HttpBody{}, "end_of_stream")
)

func fieldNumber(m proto.Message, name string) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name)).Number()
}

// unmarshalRequest decodes b into m: in place when b is a plain body chunk,
// else by proto.Unmarshal.
func unmarshalRequest(b []byte, m *extprocv3.ProcessingRequest) error {
	field, body, eos, ok := plainBodyChunk(b)
	if !ok {
		return proto.Unmarshal(b, m)
	}
	proto.Reset(m)
	chunk := &extprocv3.HttpBody{Body: body, EndOfStream: eos}
	if field == requestBodyField {
		m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: chunk}
	} else {
		m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: chunk}
	}
	return nil
}

// plainBodyChunk reads b as a ProcessingRequest of request_body or
// response_body only (field), whose HttpBody has at most its body and its
// end_of_stream, each once. body is a slice of b (nil when empty, as
// proto.Unmarshal leaves it).
func plainBodyChunk(b []byte) (field protowire.Number, body []byte, eos, ok bool) {
	field, typ, n := protowire.ConsumeTag(b)
	if n < 0 || (field != requestBodyField && field != responseBodyField) || typ != protowire.BytesType {
		return 0, nil, false, false
	}
	inner, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		return 0, nil, false, false
	}
	var seenBody, seenEOS bool
	for len(inner) > 0 {
		num, typ, n := protowire.ConsumeTag(inner)
		if n < 0 {
			return 0, nil, false, false
		}
		inner = inner[n:]
		switch {
		case num == bodyField && typ == protowire.BytesType && !seenBody:
			v, n := protowire.ConsumeBytes(inner)
			if n < 0 {
				return 0, nil, false, false
			}
			// Clipped: an append to the body must not write over the
			// frame's bytes after it.
			body, seenBody, inner = v[:len(v):len(v)], true, inner[n:]
		case num == endOfStreamField && typ == protowire.VarintType && !seenEOS:
			v, n := protowire.ConsumeVarint(inner)
			if n < 0 {
				return 0, nil, false, false
			}
			eos, seenEOS, inner = protowire.DecodeBool(v), true, inner[n:]
		default:
			return 0, nil, false, false
		}
	}
	if len(body) == 0 {
		body = nil
	}
	return field, body, eos, true
}
