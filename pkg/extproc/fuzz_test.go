package extproc

import (
	"bytes"
	"errors"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// fuzzMessages turns fuzz bytes into the messages a gateway could send: any
// kind in any order, arbitrary headers, body chunks and subset hints.
type fuzzMessages struct{ data []byte }

func (f *fuzzMessages) byte() byte {
	if len(f.data) == 0 {
		return 0
	}
	b := f.data[0]
	f.data = f.data[1:]
	return b
}

func (f *fuzzMessages) bytes() []byte {
	n := min(int(f.byte()), len(f.data))
	b := f.data[:n]
	f.data = f.data[n:]
	return b
}

func (f *fuzzMessages) metadata() *corev3.Metadata {
	var v *structpb.Value
	switch f.byte() % 6 {
	case 0:
		return nil
	case 1:
		return &corev3.Metadata{}
	case 2:
		v = structpb.NewStringValue(string(f.bytes()))
	case 3:
		var values []*structpb.Value
		for range f.byte() % 4 {
			if f.byte()%2 == 0 {
				values = append(values, structpb.NewStringValue(string(f.bytes())))
			} else {
				values = append(values, structpb.NewNumberValue(float64(f.byte())))
			}
		}
		v = structpb.NewListValue(&structpb.ListValue{Values: values})
	case 4:
		v = &structpb.Value{} // a value of no kind
	case 5:
		v = structpb.NewNullValue()
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetHintNamespace: {Fields: map[string]*structpb.Value{SubsetHintKey: v}},
	}}
}

func (f *fuzzMessages) next() *extprocv3.ProcessingRequest {
	msg := &extprocv3.ProcessingRequest{}
	eos := f.byte()%2 == 1
	switch f.byte() % 8 {
	case 0, 1:
		hm := &corev3.HeaderMap{}
		for range f.byte() % 5 {
			h := &corev3.HeaderValue{Key: string(f.bytes())}
			if f.byte()%2 == 0 {
				h.RawValue = f.bytes()
			} else {
				h.Value = string(f.bytes())
			}
			if f.byte()%4 == 0 {
				h.Key = "Content-Length"
			}
			hm.Headers = append(hm.Headers, h)
		}
		msg.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}}
	case 2, 3:
		msg.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: f.bytes(), EndOfStream: eos}}
	case 4:
		msg.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
	case 5:
		msg.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: eos}}
	case 6:
		msg.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: f.bytes()}}
	case 7:
		// No request at all.
	}
	msg.MetadataContext = f.metadata()
	return msg
}

// FuzzReadRequest feeds ReadRequest arbitrary message sequences, then
// answers the request as a picker would. Nothing may panic; an error is one
// of the documented ones; a request read whole holds exactly the body
// chunks sent, within the limit.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte{}, int64(0))
	f.Add([]byte{0, 0, 1, 7, ':', 'm', 'e', 't', 'h', 'o', 'd', 1, 4, 'P', 'O', 'S', 'T', 1, 1, 2, 3, 'a', 'b', 'c', 0}, int64(1024))
	f.Add([]byte{0, 0, 1, 1, 3, 0, 1, '9', 0, 0, 2, 5, 'h', 'e', 'l', 'l', 'o', 3, 0, 4, 3}, int64(3))
	f.Add([]byte{1, 4, 0, 0, 3, 2, 1, 'x'}, int64(-1))
	f.Fuzz(func(t *testing.T, data []byte, maxBody int64) {
		src := &fuzzMessages{data: data}
		stream := &fakeStream{}
		for range 1 + int(src.byte()%8) {
			stream.in = append(stream.in, src.next())
		}
		sent := append([]*extprocv3.ProcessingRequest(nil), stream.in...)

		req, err := ReadRequest(stream, maxBody)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			switch {
			case errors.Is(err, ErrProtocol), errors.Is(err, io.ErrUnexpectedEOF):
			case errors.Is(err, io.EOF):
				if len(sent) > 0 {
					t.Fatalf("io.EOF after %d messages", len(sent))
				}
			case errors.Is(err, ErrBodyTooLarge):
				if req == nil || req.Body != nil {
					t.Fatalf("ErrBodyTooLarge returned %+v", req)
				}
			default:
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		if req.Headers == nil {
			t.Fatal("a request read whole has no header map")
		}
		consumed := len(sent) - len(stream.in)
		if req.hasBody {
			var want []byte
			for _, m := range sent[1:consumed] {
				want = append(want, m.GetRequestBody().GetBody()...)
			}
			if !bytes.Equal(req.Body, want) || req.Body == nil {
				t.Fatalf("body %q, want %q", req.Body, want)
			}
			if maxBody > 0 && int64(len(req.Body)) > maxBody {
				t.Fatalf("body of %d bytes passed the limit %d", len(req.Body), maxBody)
			}
		} else if req.Body != nil || consumed != 1 {
			t.Fatalf("a request ended by its headers has body %q and read %d messages", req.Body, consumed)
		}

		// What a picker does next with it.
		if _, _, err := SubsetHint(req.Metadata); err != nil && err.Error() == "" {
			t.Fatal("empty subset hint error")
		}
		_ = req.Header("Content-Length")
		resps := req.Route([]string{"10.0.0.1:8000"}, nil)
		if len(resps) == 0 || resps[0].GetRequestHeaders() == nil {
			t.Fatalf("Route did not answer the headers first: %v", resps)
		}
		var echoed []byte
		for _, r := range resps[1:] {
			echoed = append(echoed, r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
		if !bytes.Equal(echoed, req.Body) {
			t.Fatalf("Route streamed back %q, want %q", echoed, req.Body)
		}
	})
}
