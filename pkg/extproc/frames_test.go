package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

func TestFrameCodec(t *testing.T) {
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}},
	}}}
	answer := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	// A field this build does not know (number 999): a frame sends it on
	// as it came.
	unknown := []byte{0xba, 0x3e, 0x03, 'n', 'e', 'w'}
	encode := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		return append(b, unknown...)
	}
	c := FrameCodec{}
	tests := []struct {
		name string
		wire []byte
		into func() (any, proto.Message)
		// edit changes the decoded message (and drops raw, as its users
		// must), or nil.
		edit func(v any)
		// received is what the wire decodes to; want what is sent.
		received, want proto.Message
	}{
		{
			name: "a gateway message is sent on as it was received",
			wire: encode(headers),
			into: func() (any, proto.Message) { f := NewRequestFrame(); return f, f.ProcessingRequest },
			want: headers,
		},
		{
			name: "an EPP answer is sent on as it was received",
			wire: encode(answer),
			into: func() (any, proto.Message) { f := NewResponseFrame(); return f, f.ProcessingResponse },
			want: answer,
		},
		{
			name: "an answer changed after it was received is encoded again",
			wire: encode(answer),
			into: func() (any, proto.Message) { f := NewResponseFrame(); return f, f.ProcessingResponse },
			edit: func(v any) {
				f := v.(*ResponseFrame)
				f.GetResponseHeaders().Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{SetHeader("x", "y")}}}
				f.Raw = nil
			},
			received: answer,
			want: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{SetHeader("x", "y")}}},
			}}},
		},
		{
			name: "other messages are plain protobuf",
			wire: encode(answer),
			into: func() (any, proto.Message) { m := &extprocv3.ProcessingResponse{}; return m, m },
			want: answer,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, msg := tt.into()
			require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tt.wire)}, v))
			received := tt.received
			if received == nil {
				received = tt.want
			}
			assert.Empty(t, cmpProto(received, msg), "decoded as protobuf")
			assert.Equal(t, unknown, []byte(msg.ProtoReflect().GetUnknown()), "unknown fields kept")
			if tt.edit != nil {
				tt.edit(v)
			}
			out, err := c.Marshal(v)
			require.NoError(t, err)
			sent := out.Materialize()
			if tt.edit == nil {
				assert.Equal(t, tt.wire, sent, "the bytes received are the bytes sent")
			}
			got := tt.want.ProtoReflect().New().Interface()
			require.NoError(t, proto.Unmarshal(sent, got))
			assert.Empty(t, cmpProto(tt.want, got), "what is sent decodes to the message")
		})
	}

	t.Run("a codec error is reported, not hidden", func(t *testing.T) {
		f := NewRequestFrame()
		assert.Error(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0xff, 0xff})}, f))
	})
}

// cmpProto says how got differs from want, ignoring unknown fields.
func cmpProto(want, got proto.Message) string {
	w, g := proto.Clone(want), proto.Clone(got)
	w.ProtoReflect().SetUnknown(nil)
	g.ProtoReflect().SetUnknown(nil)
	if proto.Equal(w, g) {
		return ""
	}
	return "want " + prototext.Format(w) + ", got " + prototext.Format(g)
}
