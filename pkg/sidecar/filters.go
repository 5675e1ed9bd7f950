package sidecar

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
)

// attrsFromRequest reads the matching attributes of a request read from a
// gateway stream.
func attrsFromRequest(req *extproc.Request) routetable.RequestAttrs {
	path, query, _ := strings.Cut(req.Header(":path"), "?")
	host := req.Header(":authority")
	if host == "" {
		host = req.Header("host")
	}
	return routetable.RequestAttrs{Host: host, Path: path, RawQuery: query, Method: req.Header(":method"), Headers: req.Headers}
}

// shimPoolOf is the gateway's filter metadata that names the shim pool a
// request is for; "" when it has none.
func shimPoolOf(req *extproc.Request) string {
	return req.Metadata.GetFilterMetadata()[routetable.ShimMetadataNamespace].GetFields()[routetable.ShimPoolKey].GetStringValue()
}

// mutation is the header mutation that applies the filters to a request
// whose headers header gives and whose rule matched matchedPrefix.
func mutation(f *routetable.Filters, header func(string) string, matchedPrefix string) *extprocv3.HeaderMutation {
	set, remove := f.Changes(header, matchedPrefix)
	m := &extprocv3.HeaderMutation{RemoveHeaders: remove}
	for _, h := range set {
		if h.Append {
			m.SetHeaders = append(m.SetHeaders, appendHeader(h.Name, h.Value))
		} else {
			m.SetHeaders = append(m.SetHeaders, extproc.SetHeader(h.Name, h.Value))
		}
	}
	return m
}

// redirectResponse answers a request with the filters' redirect.
func redirectResponse(f *routetable.Filters, header func(string) string, matchedPrefix string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(f.RedirectStatus())},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("location", f.Location(header, matchedPrefix))}},
			Details: "HTTPRoute RequestRedirect",
		}},
	}
}

// applyFilters adds the filters' mutation to the request headers answer
// among resps (the EPP's, or the sidecar's own), after what it already
// sets: the filters have the last word on the headers they name.
func applyFilters(f *routetable.Filters, resps []*extprocv3.ProcessingResponse, header func(string) string, matchedPrefix string) {
	for _, r := range resps {
		rh := r.GetRequestHeaders()
		if rh == nil {
			continue
		}
		if rh.Response == nil {
			rh.Response = &extprocv3.CommonResponse{}
		}
		m := mutation(f, header, matchedPrefix)
		if hm := rh.Response.HeaderMutation; hm != nil {
			hm.SetHeaders = append(hm.SetHeaders, m.SetHeaders...)
			hm.RemoveHeaders = append(hm.RemoveHeaders, m.RemoveHeaders...)
		} else {
			rh.Response.HeaderMutation = m
		}
		// The gateway routes on the mutated headers.
		rh.Response.ClearRouteCache = true
		return
	}
}

// appendHeader adds a value to a header, keeping the values it has.
func appendHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, RawValue: []byte(value)}, AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD}
}
