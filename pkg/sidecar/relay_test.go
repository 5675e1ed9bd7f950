package sidecar

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// TestForRemote checks that the copies forRemote makes keep every field
// but those a remote EPP is not to get, those this build knows and those
// it does not: it fills every field of each message forRemote copies, so
// that a field added to them in a newer go-control-plane fails here until
// forRemote copies it (or decides that a remote EPP does not get it).
func TestForRemote(t *testing.T) {
	metadata := func(hint bool) *corev3.Metadata {
		md := &corev3.Metadata{}
		fill(md)
		if hint {
			md.FilterMetadata[extproc.SubsetHintNamespace] = extproc.SubsetHintMetadata("10.0.0.1:8000").FilterMetadata[extproc.SubsetHintNamespace]
		}
		return md
	}
	request := func(hint, nilHeaders bool) []*extprocv3.ProcessingRequest {
		h := &extprocv3.HttpHeaders{}
		fill(h)
		if nilHeaders {
			h.Headers = nil
		} else {
			// Room to spare in the headers' array: an append to the
			// copy's headers must not write into it.
			h.Headers = &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, 8)}
			fill(h.Headers)
		}
		first := &extprocv3.ProcessingRequest{}
		fill(first)
		first.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}
		first.MetadataContext = metadata(hint)
		// A gateway that forwards metadata sends it with every message.
		body := &extprocv3.ProcessingRequest{}
		fill(body)
		body.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}
		body.MetadataContext = metadata(hint)
		return []*extprocv3.ProcessingRequest{first, body}
	}

	for _, tt := range []struct {
		name             string
		hint, nilHeaders bool
		// forwarded are the metadata namespaces remote EPPs get.
		forwarded []string
	}{
		{name: "without a subset hint"},
		{name: "with a subset hint", hint: true},
		{name: "with a header message without headers", nilHeaders: true},
		{name: "with metadata namespaces forwarded", forwarded: []string{"filter_metadata", "typed_filter_metadata"}},
		{name: "with metadata namespaces and a subset hint forwarded", hint: true, forwarded: []string{"filter_metadata", "typed_filter_metadata", extproc.SubsetHintNamespace}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msgs := request(tt.hint, tt.nilHeaders)
			before := make([]*extprocv3.ProcessingRequest, len(msgs))
			for i, m := range msgs {
				before[i] = proto.Clone(m).(*extprocv3.ProcessingRequest)
			}

			filter := newRemoteAnswers(eppanswer.Policy{}, nil, tt.forwarded, nil, logr.Discard())
			out := forRemote(msgs, "cluster-b", filter)
			// Another copy, as for another request relayed from the same
			// one, must leave the first alone.
			forRemote(msgs, "cluster-c", filter)

			for i := range msgs {
				assert.True(t, proto.Equal(before[i], msgs[i]), "the original message %d changed:\n%v", i, msgs[i])
			}
			require.Len(t, out, 2)
			want := make([]*extprocv3.ProcessingRequest, len(before))
			for i, m := range before {
				want[i] = proto.Clone(m).(*extprocv3.ProcessingRequest)
				// The attributes describe the client's connection to this
				// gateway; the metadata is the gateway's, but for the
				// namespaces forwarded (never the subset hint).
				want[i].Attributes = nil
				if tt.forwarded == nil {
					want[i].MetadataContext = nil
				} else {
					want[i].MetadataContext = &corev3.Metadata{FilterMetadata: want[i].MetadataContext.FilterMetadata, TypedFilterMetadata: want[i].MetadataContext.TypedFilterMetadata}
					delete(want[i].MetadataContext.FilterMetadata, extproc.SubsetHintNamespace)
				}
			}
			h := want[0].GetRequestHeaders()
			h.Attributes = nil
			if h.Headers == nil {
				h.Headers = &corev3.HeaderMap{}
			}
			h.Headers.Headers = append(h.Headers.Headers, &corev3.HeaderValue{Key: extproc.RelayedHeader, RawValue: []byte("cluster-b")})
			for i := range want {
				assert.True(t, proto.Equal(want[i], out[i]), "message %d: want\n%v\ngot\n%v", i, want[i], out[i])
			}
			assert.Same(t, msgs[1].Request, out[1].Request, "the body is shared")
		})
	}

	t.Run("a message with nothing to remove is shared", func(t *testing.T) {
		filter := newRemoteAnswers(eppanswer.Policy{}, nil, []string{"tenant"}, nil, logr.Discard())
		for _, md := range []*corev3.Metadata{nil, extproc.ServedMetadata("10.0.0.1:8000"), {FilterMetadata: map[string]*structpb.Struct{"tenant": {}}}} {
			m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{}, MetadataContext: md}
			assert.Same(t, m, filter.message(m))
		}
	})
}

// fill sets every field of m that is not part of a oneof to a value that is
// not the default, and adds an unknown field.
func fill(m proto.Message) {
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic():
		case fd.IsList():
			l := r.Mutable(fd).List()
			l.Append(scalarOrNew(fd, l.NewElement()))
		case fd.IsMap():
			mp := r.Mutable(fd).Map()
			mp.Set(protoreflect.ValueOfString(string(fd.Name())).MapKey(), scalarOrNew(fd.MapValue(), mp.NewValue()))
		default:
			r.Set(fd, scalarOrNew(fd, r.NewField(fd)))
		}
	}
	r.SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9999, protowire.VarintType), 1))
}

// scalarOrNew returns a value of fd's kind that is not the default, or
// empty, the new message or element given.
func scalarOrNew(fd protoreflect.FieldDescriptor, empty protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(string(fd.Name()))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(fd.Name()))
	default:
		return empty
	}
}

// TestForRemoteStripsCredentials checks that the client's credentials, in
// the request's headers and trailers, never go to a remote EPP, whatever
// their case, while the local EPP gets the request as the gateway sent it.
func TestForRemoteStripsCredentials(t *testing.T) {
	header := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header(":path", "/v1/completions"), header("authorization", "Bearer secret"), header("Cookie", "session=secret"),
			header("proxy-authorization", "Basic secret"), header("x-api-key", "secret"), header("x-tenant-token", "secret"), header("content-type", "application/json"),
		}}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}")}}},
		{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header("authorization", "Bearer secret"), header("x-checksum", "1"),
		}}}}},
	}
	before := make([]*extprocv3.ProcessingRequest, len(msgs))
	for i, m := range msgs {
		before[i] = proto.Clone(m).(*extprocv3.ProcessingRequest)
	}
	r := newRemoteAnswers(eppanswer.Policy{}, []string{"X-Tenant-Token"}, nil, nil, logr.Discard())
	out := forRemote(msgs, "cluster-b", r)

	names := func(hs []*corev3.HeaderValue) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.GetKey())
		}
		return out
	}
	assert.Equal(t, []string{":path", "content-type", extproc.RelayedHeader}, names(out[0].GetRequestHeaders().GetHeaders().GetHeaders()))
	assert.Equal(t, []string{"x-checksum"}, names(out[2].GetRequestTrailers().GetTrailers().GetHeaders()))
	for i := range msgs {
		assert.True(t, proto.Equal(before[i], msgs[i]), "the local EPP's message %d changed", i)
	}
}

// TestRelaySendsTheGatewaysBytes checks that a body chunk the gateway sent
// reaches an EPP as the same bytes, the local EPP and a remote one alike
// (the sidecar changes no body chunk). The gateway encodes it as protobuf
// allows but Go does not (end_of_stream before the body), so that a chunk
// decoded and encoded again would differ.
func TestRelaySendsTheGatewaysBytes(t *testing.T) {
	local, remote, in := localAndRemoteEPPs(t)
	in.Routes = []*gatewayv1.HTTPRoute{
		sidecartest.Route("local", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/local")}, sidecartest.PoolRef("llm", nil))),
		sidecartest.Route("remote", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/remote")}, sidecartest.ImportRef("llm", nil))),
	}
	h := startServer(t, in, &fakeState{})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(extproc.FrameCodec{})))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()

	var chunk []byte
	chunk = protowire.AppendTag(chunk, 2, protowire.VarintType)
	chunk = protowire.AppendVarint(chunk, 1)
	chunk = protowire.AppendTag(chunk, 1, protowire.BytesType)
	chunk = protowire.AppendBytes(chunk, chatBody)
	var bodyFrame []byte
	bodyFrame = protowire.AppendTag(bodyFrame, 4, protowire.BytesType)
	bodyFrame = protowire.AppendBytes(bodyFrame, chunk)
	decoded := extproc.NewRequestFrame()
	require.NoError(t, proto.Unmarshal(bodyFrame, decoded.ProcessingRequest))
	require.Equal(t, chatBody, decoded.GetRequestBody().GetBody(), "the chunk as encoded here")
	canonical, err := proto.Marshal(decoded.ProcessingRequest)
	require.NoError(t, err)
	require.NotEqual(t, bodyFrame, canonical, "the chunk must differ from Go's own encoding")

	for _, tt := range []struct {
		path string
		epp  *fakeEPP
	}{
		{path: "/local", epp: local},
		{path: "/remote", epp: remote},
	} {
		t.Run(tt.path, func(t *testing.T) {
			headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(tt.path)}, {Key: "content-type", RawValue: []byte("application/json")},
				}},
			}}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
			require.NoError(t, err)
			require.NoError(t, stream.Send(headers))
			require.NoError(t, stream.SendMsg(&extproc.RequestFrame{ProcessingRequest: decoded.ProcessingRequest, Raw: bodyFrame}))
			first, err := stream.Recv()
			require.NoError(t, err)
			require.NotNil(t, first.GetRequestHeaders(), "the answer: %v", first)
			require.NoError(t, stream.CloseSend())

			frames := tt.epp.framesOf()
			require.Len(t, frames, 2)
			assert.Equal(t, bodyFrame, frames[1], "the body chunk reaches the EPP as the gateway's bytes")
		})
	}
}
