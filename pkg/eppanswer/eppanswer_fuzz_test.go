package eppanswer

import (
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/mci-dev/mci/pkg/extproc"
)

// FuzzFilter feeds Filter arbitrary answers of a remote EPP, as the wire
// brings them (encoded ProcessingResponses), and checks that nothing it
// accepts reaches the gateway beyond what routing needs: a destination
// that passes CheckEndpoint on the published port, at an address the
// exporter published (itself or within a published prefix), agreeing in header and
// metadata; no header but the destination and content-length; no
// metadata but envoy.lb's destination; a body that is the request's or
// differs in its model only; an immediate response only of a passing
// status, with the sidecar's body.
func FuzzFilter(f *testing.F) {
	add := func(resps []*extprocv3.ProcessingResponse, reqBody string) {
		var encoded [][]byte
		for _, r := range resps {
			b, err := proto.Marshal(r)
			if err != nil {
				f.Fatal(err)
			}
			encoded = append(encoded, b)
		}
		for len(encoded) < 3 {
			encoded = append(encoded, nil)
		}
		f.Add(encoded[0], encoded[1], encoded[2], reqBody)
	}
	add(answer(setDestination("10.8.0.5:8000"), extproc.DestinationMetadata("10.8.0.5:8000"), body), body)
	add(answer(setDestination("10.8.0.5:8000"), nil, `{"model":"other","prompt":"hello"}`), body)
	add(answer(setDestination("10.9.1.77:8000,10.8.0.7:8000"), nil, body), body)
	add(answer(setDestination("127.0.0.1:8000"), nil, body), body)
	add(answer(setDestination("169.254.169.254:80"), extproc.DestinationMetadata("169.254.169.254:80"), body), body)
	add(answer(setDestination("10.8.0.5:8000"), extproc.DestinationMetadata("10.96.0.1:443"), body), body)
	add(answer(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader(":authority", "evil"), extproc.SetHeader(extproc.DestinationEndpointHeader, "[::ffff:10.96.0.1]:8000")}}, nil, "x"), body)
	add([]*extprocv3.ProcessingResponse{extproc.ErrorResponse(302, "elsewhere")}, body)
	add([]*extprocv3.ProcessingResponse{extproc.ErrorResponse(429, "shed")}, body)
	add(answer(setDestination("10.8.0.5:8000,10.8.0.6:8000"), nil, `{"prompt":"hello","model":"a"}`), body)

	policy := Policy{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	// The exporter published two pods, a /24 and an address in a denied
	// range.
	pub := mustPublished("10.8.0.5", "10.8.0.6", "10.9.1.0/24", "10.96.0.1")
	publishedTo := func(a netip.Addr) bool {
		return a == netip.MustParseAddr("10.8.0.5") || a == netip.MustParseAddr("10.8.0.6") || netip.MustParsePrefix("10.9.1.0/24").Contains(a)
	}
	f.Fuzz(func(t *testing.T, a, b, c []byte, reqBody string) {
		var resps []*extprocv3.ProcessingResponse
		for _, raw := range [][]byte{a, b, c} {
			if raw == nil {
				continue
			}
			r := &extprocv3.ProcessingResponse{}
			if proto.Unmarshal(raw, r) != nil {
				return
			}
			resps = append(resps, r)
		}
		req := request(t, reqBody)
		out, err := policy.Filter(req, resps, pub, "cluster-a")
		if err != nil {
			return
		}
		if len(out) == 0 {
			t.Fatal("accepted with no answer")
		}
		if ir := out[0].GetImmediateResponse(); ir != nil {
			if len(out) != 1 || !PassingStatus(int(ir.GetStatus().GetCode())) {
				t.Fatalf("an immediate response of status %d passed", ir.GetStatus().GetCode())
			}
			if want := Immediate(int(ir.GetStatus().GetCode()), "cluster-a"); !proto.Equal(want, out[0]) {
				t.Fatalf("the immediate response is not the sidecar's: %v", out[0])
			}
			return
		}
		h := out[0].GetRequestHeaders()
		if h == nil {
			t.Fatalf("the answer starts with %T", out[0].Response)
		}
		dest := ""
		for _, hv := range h.GetResponse().GetHeaderMutation().GetSetHeaders() {
			switch hv.GetHeader().GetKey() {
			case extproc.DestinationEndpointHeader:
				dest = string(hv.GetHeader().GetRawValue())
			case "content-length":
			default:
				t.Fatalf("header %q passed", hv.GetHeader().GetKey())
			}
		}
		if len(h.GetResponse().GetHeaderMutation().GetRemoveHeaders()) > 0 {
			t.Fatal("a header removal passed")
		}
		if md := out[0].GetDynamicMetadata(); len(md.GetFields()) != 1 || extproc.DestinationFromMetadata(md) != dest {
			t.Fatalf("metadata %v passed with destination %q", md, dest)
		}
		endpoints := extproc.SplitEndpoints(dest)
		if len(endpoints) == 0 {
			t.Fatal("accepted without a destination")
		}
		for _, e := range endpoints {
			if err := policy.CheckEndpoint(e, 8000); err != nil {
				t.Fatalf("destination %q passed: %v", e, err)
			}
			ap := netip.MustParseAddrPort(e)
			if a := ap.Addr().Unmap(); a.IsLoopback() || a.IsLinkLocalUnicast() || policy.Denied[0].Contains(a) || ap.Port() != 8000 || !publishedTo(a) {
				t.Fatalf("destination %q passed", e)
			}
		}
		var got []byte
		for _, r := range out[1:] {
			got = append(got, r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
		if string(got) != reqBody && !onlyModelDiffers([]byte(reqBody), got) {
			t.Fatalf("body %q passed for request body %q", got, reqBody)
		}
	})
}

// FuzzResponsePhase feeds ResponsePhase arbitrary answers of a remote EPP
// to a message of the response phase, as the wire brings them, and checks
// that what it accepts reaches the gateway as an empty answer of the
// phase's own kind (the response passes unchanged: no header, body or
// trailer mutation, no mode override, no dynamic metadata), and that it
// refuses exactly what CheckResponsePhase refuses.
func FuzzResponsePhase(f *testing.F) {
	for _, r := range []*extprocv3.ProcessingResponse{
		{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("set-cookie", "session=evil")}},
		}}}},
		{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			Status: extprocv3.CommonResponse_CONTINUE_AND_REPLACE,
		}}}},
		{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}},
		extproc.ErrorResponse(302, "elsewhere"),
		{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := &extprocv3.ProcessingResponse{}
		if proto.Unmarshal(raw, r) != nil {
			return
		}
		out, err := ResponsePhase(r)
		if (err == nil) != (CheckResponsePhase(r) == nil) {
			t.Fatalf("ResponsePhase and CheckResponsePhase disagree: %v", err)
		}
		if err != nil {
			return
		}
		var want *extprocv3.ProcessingResponse
		switch r.Response.(type) {
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			want = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingResponse_ResponseBody:
			want = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			want = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		default:
			t.Fatalf("a %T in the response phase passed", r.Response)
		}
		if !proto.Equal(want, out) {
			t.Fatalf("the gateway got %v, want the empty answer %v", out, want)
		}
	})
}
