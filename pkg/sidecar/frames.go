package sidecar

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	// The proto codec frameCodec delegates to.
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/mci-dev/mci/pkg/extproc"
)

// The response phase is relayed message by message, and the sidecar
// changes none of them (but for --explain-decisions' header): it reads
// each one (its kind, body bytes, end of stream) to answer what the EPP
// owes if it fails, then sends it on (the EPP's answers to body chunks
// that went ahead are read and checked, not sent: owed). Encoding a message again costs as
// much as decoding it; frames skip that. A requestFrame or responseFrame
// read with frameCodec keeps the bytes it was decoded from, and is sent as
// those bytes. Both are proto.Messages (the embedded message's methods),
// so a stream without frameCodec reads and writes them as plain protobuf.

// requestFrame is a message of the gateway, decoded, with its encoding.
type requestFrame struct {
	*extprocv3.ProcessingRequest
	raw []byte
}

func newRequestFrame() *requestFrame {
	return &requestFrame{ProcessingRequest: &extprocv3.ProcessingRequest{}}
}

// responseFrame is an answer of the EPP, decoded, with its encoding.
// Whoever changes the message drops raw.
type responseFrame struct {
	*extprocv3.ProcessingResponse
	raw []byte
}

func newResponseFrame() *responseFrame {
	return &responseFrame{ProcessingResponse: &extprocv3.ProcessingResponse{}}
}

// frameCodec is gRPC's protobuf codec, but for frames: a frame is decoded
// keeping a copy of its bytes, and one that has them is sent as they are.
// It is the codec of the sidecar's ext_proc server (serverOptions) and of
// its connections to EPPs.
type frameCodec struct{}

var protoCodec = encoding.GetCodecV2("proto")

func (frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch f := v.(type) {
	case *requestFrame:
		if f.raw != nil {
			return mem.BufferSlice{mem.SliceBuffer(f.raw)}, nil
		}
	case *responseFrame:
		if f.raw != nil {
			return mem.BufferSlice{mem.SliceBuffer(f.raw)}, nil
		}
	}
	return protoCodec.Marshal(v)
}

func (frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch f := v.(type) {
	case *requestFrame:
		// proto.Unmarshal copies what it keeps: raw is the frame's own.
		f.raw = data.Materialize()
		return proto.Unmarshal(f.raw, f.ProcessingRequest)
	case *responseFrame:
		f.raw = data.Materialize()
		return proto.Unmarshal(f.raw, f.ProcessingResponse)
	}
	return protoCodec.Unmarshal(data, v)
}

// Name is the protobuf codec's: the content type on the wire is the same.
func (frameCodec) Name() string { return protoCodec.Name() }

// serverOptions are the options of a gRPC server that serves Server: the
// frame codec.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(frameCodec{})}
}

// gatewayStream is the gateway's stream in the response phase: an
// extproc.Stream whose messages can also be read and sent as frames.
type gatewayStream interface {
	extproc.Stream
	RecvMsg(m any) error
	SendMsg(m any) error
}
