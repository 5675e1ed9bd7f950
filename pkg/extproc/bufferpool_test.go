package extproc

import (
	"bytes"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// TestFramePoolDirtyBuffers holds FrameCodec to what the protobuf codec
// makes of messages of every size class, while every buffer FramePool
// hands out is full of what an earlier user left in it: nothing of it may
// reach a message.
func TestFramePoolDirtyBuffers(t *testing.T) {
	c := FrameCodec{}
	for _, n := range []int{0, 100, 1 << 10, 5000, 16 << 10, 40 << 10, 1 << 20, 9 << 20} {
		body := bytes.Repeat([]byte("prompt "), n/7+1)[:n]
		req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
		want, err := proto.Marshal(req)
		require.NoError(t, err)

		poison(len(want))
		data, err := c.Marshal(req)
		require.NoError(t, err)
		assert.Equal(t, want, data.Materialize(), "%d bytes: marshalled", n)
		data.Free()

		// A message as the transport hands it over: in frames of 16 KiB.
		var frames mem.BufferSlice
		for rest := want; len(rest) > 0; rest = rest[min(len(rest), 16<<10):] {
			frames = append(frames, mem.SliceBuffer(rest[:min(len(rest), 16<<10)]))
		}
		poison(len(want))
		got := &extprocv3.ProcessingRequest{}
		require.NoError(t, c.Unmarshal(frames, got))
		assert.True(t, proto.Equal(req, got), "%d bytes: unmarshalled", n)
		poison(len(want))
		assert.True(t, bytes.Equal(body, got.GetRequestBody().GetBody()), "%d bytes: the body decoded outlives the buffer it was decoded from", n)
	}
}

// poison puts buffers for messages of n bytes in FramePool full of 0xff.
func poison(n int) {
	for range 4 {
		b := FramePool.Get(n)
		*b = (*b)[:cap(*b)]
		for i := range *b {
			(*b)[i] = 0xff
		}
		FramePool.Put(b)
	}
}

func TestFramePoolSizes(t *testing.T) {
	for _, tt := range []struct{ n, cap int }{
		{0, 1 << 10}, {1, 1 << 10}, {1 << 10, 1 << 10}, {1<<10 + 1, 2 << 10}, {40 << 10, 64 << 10}, {8 << 20, 8 << 20}, {8<<20 + 1, 8<<20 + 1},
	} {
		b := FramePool.Get(tt.n)
		assert.Len(t, *b, tt.n)
		assert.Equal(t, tt.cap, cap(*b), "a buffer of %d bytes", tt.n)
		FramePool.Put(b)
	}
	// A buffer of a size the pool does not hold is dropped, not handed out
	// for a larger one.
	odd := make([]byte, 3000)
	FramePool.Put(&odd)
	assert.GreaterOrEqual(t, cap(*FramePool.Get(3000)), 4<<10)
}
