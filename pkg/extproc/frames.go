package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	// The proto codec FrameCodec delegates to.
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Frames let a relay pass ext_proc messages on without encoding them
// again: the sidecar relays the response phase message by message and
// changes none of them (but for its --explain-decisions header); it reads
// each one (its kind, body bytes, end of stream) to answer what the EPP
// owes if it fails, then sends it on. Encoding a message again costs as
// much as decoding it; frames skip that. A RequestFrame or ResponseFrame
// read with FrameCodec keeps the bytes it was decoded from, and is sent as
// those bytes. Both are proto.Messages (the embedded message's methods),
// so a stream without FrameCodec reads and writes them as plain protobuf.

// RequestFrame is a message of the gateway, decoded, with its encoding
// (Raw). Whoever changes the message drops Raw.
type RequestFrame struct {
	*extprocv3.ProcessingRequest
	Raw []byte
}

// NewRequestFrame returns an empty frame to read a message into.
func NewRequestFrame() *RequestFrame {
	return &RequestFrame{ProcessingRequest: &extprocv3.ProcessingRequest{}}
}

// ResponseFrame is an answer of the EPP, decoded, with its encoding
// (Raw). Whoever changes the message drops Raw.
type ResponseFrame struct {
	*extprocv3.ProcessingResponse
	Raw []byte
}

// NewResponseFrame returns an empty frame to read an answer into.
func NewResponseFrame() *ResponseFrame {
	return &ResponseFrame{ProcessingResponse: &extprocv3.ProcessingResponse{}}
}

// FrameCodec is gRPC's protobuf codec, but for frames: a frame is decoded
// keeping a copy of its bytes, and one that has them is sent as they are.
// It is the codec of the sidecar's ext_proc server and of its connections
// to EPPs.
type FrameCodec struct{}

var protoCodec = encoding.GetCodecV2("proto")

func (FrameCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch f := v.(type) {
	case *RequestFrame:
		if f.Raw != nil {
			return mem.BufferSlice{mem.SliceBuffer(f.Raw)}, nil
		}
	case *ResponseFrame:
		if f.Raw != nil {
			return mem.BufferSlice{mem.SliceBuffer(f.Raw)}, nil
		}
	}
	m, ok := v.(proto.Message)
	if !ok {
		return protoCodec.Marshal(v)
	}
	// As the protobuf codec does, but into a buffer of FramePool, which
	// is not cleared first.
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := proto.MarshalOptions{UseCachedSize: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := FramePool.Get(size)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		FramePool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, FramePool)}, nil
}

func (FrameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch f := v.(type) {
	case *RequestFrame:
		// proto.Unmarshal copies what it keeps: Raw is the frame's own,
		// and a body chunk's body is read in place (unmarshalRequest).
		f.Raw = data.Materialize()
		return unmarshalRequest(f.Raw, f.ProcessingRequest)
	case *ResponseFrame:
		f.Raw = data.Materialize()
		return proto.Unmarshal(f.Raw, f.ProcessingResponse)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	if len(data) <= 1 {
		var b []byte
		if len(data) == 1 {
			b = data[0].ReadOnlyData()
		}
		return proto.Unmarshal(b, m)
	}
	// A message of more than one frame is gathered in a buffer of
	// FramePool, which is not cleared first: proto.Unmarshal copies what
	// it keeps, so the buffer goes back to the pool at once.
	buf := FramePool.Get(data.Len())
	defer FramePool.Put(buf)
	data.CopyTo(*buf)
	return proto.Unmarshal(*buf, m)
}

// Name is the protobuf codec's: the content type on the wire is the same.
func (FrameCodec) Name() string { return protoCodec.Name() }

// FrameStream is a Stream whose messages can also be read and sent as
// frames: the gateway's stream in the response phase.
type FrameStream interface {
	Stream
	RecvMsg(m any) error
	SendMsg(m any) error
}
