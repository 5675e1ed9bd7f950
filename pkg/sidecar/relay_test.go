package sidecar

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
)

// TestForRemote checks that the copy forRemote makes of the first message
// keeps every field, those this build knows and those it does not: it fills
// every field of each message forRemote copies, so that a field added to
// them in a newer go-control-plane fails here until forRemote copies it.
func TestForRemote(t *testing.T) {
	request := func(hint, nilHeaders bool) []*extprocv3.ProcessingRequest {
		md := &corev3.Metadata{}
		fill(md)
		if hint {
			md.FilterMetadata[extproc.SubsetHintNamespace] = extproc.SubsetHintMetadata("10.0.0.1:8000").FilterMetadata[extproc.SubsetHintNamespace]
		}
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
		first.MetadataContext = md
		return []*extprocv3.ProcessingRequest{
			first,
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}},
		}
	}

	for _, tt := range []struct {
		name             string
		hint, nilHeaders bool
	}{
		{name: "without a subset hint"},
		{name: "with a subset hint", hint: true},
		{name: "with a header message without headers", nilHeaders: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msgs := request(tt.hint, tt.nilHeaders)
			before := make([]*extprocv3.ProcessingRequest, len(msgs))
			for i, m := range msgs {
				before[i] = proto.Clone(m).(*extprocv3.ProcessingRequest)
			}

			strip := newRemoteAnswers(eppanswer.Policy{}, nil, nil, logr.Discard()).stripHeaders
			out := forRemote(msgs, "cluster-b", strip)
			// Another copy, as for another request relayed from the same
			// one, must leave the first alone.
			forRemote(msgs, "cluster-c", strip)

			for i := range msgs {
				assert.True(t, proto.Equal(before[i], msgs[i]), "the original message %d changed:\n%v", i, msgs[i])
			}
			require.Len(t, out, 2)
			assert.Same(t, msgs[1], out[1], "the body is shared")
			want := proto.Clone(before[0]).(*extprocv3.ProcessingRequest)
			delete(want.MetadataContext.FilterMetadata, extproc.SubsetHintNamespace)
			h := want.GetRequestHeaders()
			if h.Headers == nil {
				h.Headers = &corev3.HeaderMap{}
			}
			h.Headers.Headers = append(h.Headers.Headers, &corev3.HeaderValue{Key: RelayedHeader, RawValue: []byte("cluster-b")})
			assert.True(t, proto.Equal(want, out[0]), "want\n%v\ngot\n%v", want, out[0])
		})
	}
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
	r := newRemoteAnswers(eppanswer.Policy{}, []string{"X-Tenant-Token"}, nil, logr.Discard())
	out := forRemote(msgs, "cluster-b", r.stripHeaders)

	names := func(hs []*corev3.HeaderValue) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.GetKey())
		}
		return out
	}
	assert.Equal(t, []string{":path", "content-type", RelayedHeader}, names(out[0].GetRequestHeaders().GetHeaders().GetHeaders()))
	assert.Equal(t, []string{"x-checksum"}, names(out[2].GetRequestTrailers().GetTrailers().GetHeaders()))
	for i := range msgs {
		assert.True(t, proto.Equal(before[i], msgs[i]), "the local EPP's message %d changed", i)
	}
}
