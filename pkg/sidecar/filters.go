package sidecar

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/extproc"
)

// requestFilters is what the HTTPRoute filters of a rule, and of the
// backendRef the sidecar picked in it, do to a request. The sidecar applies
// them because only it knows which backendRef a request goes to; the
// gateway forwards the request as the ext_proc answer mutates it.
//
// What an ext_proc answer can do is supported: RequestHeaderModifier,
// URLRewrite and RequestRedirect. A filter the sidecar cannot apply
// (ResponseHeaderModifier, RequestMirror, CORS, ExternalAuth, ExtensionRef)
// makes its rule answer 500 rather than route without it: skipping an
// authentication or a header the backend relies on must not go unnoticed.
type requestFilters struct {
	setHeaders    []header
	addHeaders    []header
	removeHeaders []string
	// hostname replaces the request's host (URLRewrite).
	hostname string
	// path is the URLRewrite's, or the RequestRedirect's: the API allows
	// one of the two per rule.
	path     *pathModifier
	rewrites bool
	redirect *redirect
}

type header struct{ name, value string }

// pathModifier is a URLRewrite's or RequestRedirect's path.
type pathModifier struct {
	// full replaces the whole path; else prefix replaces the part the
	// rule's PathPrefix match matched.
	full   *string
	prefix *string
}

type redirect struct {
	scheme   string
	hostname string
	port     int32
	status   int
}

// empty says whether the filters change nothing.
func (f *requestFilters) empty() bool {
	return f == nil || (len(f.setHeaders) == 0 && len(f.addHeaders) == 0 && len(f.removeHeaders) == 0 &&
		f.hostname == "" && f.path == nil && f.redirect == nil)
}

// compileFilters turns a rule's filters, then a backendRef's, into
// requestFilters. An error says why the rule cannot be served.
func compileFilters(lists ...[]gatewayv1.HTTPRouteFilter) (*requestFilters, error) {
	f := &requestFilters{}
	for _, list := range lists {
		for i, filter := range list {
			if err := f.add(filter); err != nil {
				return nil, fmt.Errorf("filter %d (%s): %w", i, filter.Type, err)
			}
		}
	}
	if f.redirect != nil && f.rewrites {
		return nil, fmt.Errorf("a RequestRedirect cannot be combined with a URLRewrite")
	}
	if f.empty() {
		return nil, nil
	}
	return f, nil
}

func (f *requestFilters) add(filter gatewayv1.HTTPRouteFilter) error {
	switch filter.Type {
	case gatewayv1.HTTPRouteFilterRequestHeaderModifier:
		m := filter.RequestHeaderModifier
		if m == nil {
			return fmt.Errorf("requestHeaderModifier is missing")
		}
		for _, h := range m.Set {
			f.setHeaders = append(f.setHeaders, header{name: strings.ToLower(string(h.Name)), value: h.Value})
		}
		for _, h := range m.Add {
			f.addHeaders = append(f.addHeaders, header{name: strings.ToLower(string(h.Name)), value: h.Value})
		}
		for _, name := range m.Remove {
			f.removeHeaders = append(f.removeHeaders, strings.ToLower(name))
		}
		return nil
	case gatewayv1.HTTPRouteFilterURLRewrite:
		r := filter.URLRewrite
		if r == nil {
			return fmt.Errorf("urlRewrite is missing")
		}
		f.rewrites = true
		if r.Hostname != nil {
			f.hostname = string(*r.Hostname)
		}
		if r.Path != nil {
			p, err := compilePath(r.Path)
			if err != nil {
				return err
			}
			f.path = p
		}
		return nil
	case gatewayv1.HTTPRouteFilterRequestRedirect:
		r := filter.RequestRedirect
		if r == nil {
			return fmt.Errorf("requestRedirect is missing")
		}
		rd := &redirect{status: http.StatusFound}
		if r.Scheme != nil {
			rd.scheme = strings.ToLower(*r.Scheme)
		}
		if r.Hostname != nil {
			rd.hostname = string(*r.Hostname)
		}
		if r.Port != nil {
			rd.port = int32(*r.Port)
		}
		if r.StatusCode != nil {
			switch *r.StatusCode {
			case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
				rd.status = *r.StatusCode
			default:
				return fmt.Errorf("status code %d is not a redirect", *r.StatusCode)
			}
		}
		if r.Path != nil {
			p, err := compilePath(r.Path)
			if err != nil {
				return err
			}
			f.path = p
		}
		f.redirect = rd
		return nil
	default:
		return fmt.Errorf("mci-sidecar cannot apply the %s filter: requests of the rule get 500 rather than skip it", filter.Type)
	}
}

func compilePath(p *gatewayv1.HTTPPathModifier) (*pathModifier, error) {
	switch p.Type {
	case gatewayv1.FullPathHTTPPathModifier:
		if p.ReplaceFullPath == nil {
			return nil, fmt.Errorf("path type ReplaceFullPath without replaceFullPath")
		}
		return &pathModifier{full: p.ReplaceFullPath}, nil
	case gatewayv1.PrefixMatchHTTPPathModifier:
		if p.ReplacePrefixMatch == nil {
			return nil, fmt.Errorf("path type ReplacePrefixMatch without replacePrefixMatch")
		}
		return &pathModifier{prefix: p.ReplacePrefixMatch}, nil
	default:
		return nil, fmt.Errorf("unknown path modifier type %q", p.Type)
	}
}

// rewritePath applies m to path (which may carry a query), given the
// prefix the rule's match matched ("" for a match that is not a
// PathPrefix, for which ReplacePrefixMatch is refused when the route is
// built).
func (m *pathModifier) rewritePath(path, matchedPrefix string) string {
	p, query, hasQuery := strings.Cut(path, "?")
	switch {
	case m.full != nil:
		p = *m.full
	case m.prefix != nil:
		rest := strings.TrimPrefix(p, strings.TrimSuffix(matchedPrefix, "/"))
		replacement := strings.TrimSuffix(*m.prefix, "/")
		switch {
		case rest == "" && replacement == "":
			p = "/"
		case rest == "" || strings.HasPrefix(rest, "/"):
			p = replacement + rest
		default:
			p = replacement + "/" + rest
		}
		if p == "" {
			p = "/"
		}
	}
	if hasQuery {
		return p + "?" + query
	}
	return p
}

// mutation is the header mutation that applies the filters to a request
// whose headers (":path", ":authority", ":scheme" among them) header gives
// and whose rule matched matchedPrefix. Not for a redirect, which answers
// instead.
func (f *requestFilters) mutation(header func(string) string, matchedPrefix string) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{}
	for _, h := range f.setHeaders {
		m.SetHeaders = append(m.SetHeaders, extproc.SetHeader(h.name, h.value))
	}
	for _, h := range f.addHeaders {
		m.SetHeaders = append(m.SetHeaders, appendHeader(h.name, h.value))
	}
	m.RemoveHeaders = append(m.RemoveHeaders, f.removeHeaders...)
	if f.hostname != "" {
		m.SetHeaders = append(m.SetHeaders, extproc.SetHeader(":authority", f.hostname))
	}
	if f.path != nil {
		m.SetHeaders = append(m.SetHeaders, extproc.SetHeader(":path", f.path.rewritePath(header(":path"), matchedPrefix)))
	}
	return m
}

// location is where a redirect sends a request with headers whose rule
// matched matchedPrefix, following the Gateway API's rules: the scheme,
// host and path of the request unless the filter replaces them, and a port
// only when it is not the scheme's well-known one.
func (f *requestFilters) location(header func(string) string, matchedPrefix string) string {
	rd := f.redirect
	scheme := header(":scheme")
	if scheme == "" {
		scheme = "http"
	}
	host, port := header(":authority"), ""
	if h, p, err := net.SplitHostPort(host); err == nil {
		host, port = h, p
	}
	if rd.scheme != "" {
		scheme = rd.scheme
		// A scheme without a port redirects to the scheme's own port.
		port = ""
	}
	if rd.hostname != "" {
		host = rd.hostname
	}
	if rd.port != 0 {
		port = strconv.Itoa(int(rd.port))
	}
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if port != "" {
		host = net.JoinHostPort(host, port)
	}
	path := header(":path")
	if f.path != nil {
		path = f.path.rewritePath(path, matchedPrefix)
	}
	return scheme + "://" + host + path
}

// redirectResponse answers a request with the redirect.
func (f *requestFilters) redirectResponse(header func(string) string, matchedPrefix string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(f.redirect.status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("location", f.location(header, matchedPrefix))}},
			Details: "HTTPRoute RequestRedirect",
		}},
	}
}

// applyTo adds the filters' mutation to the request headers answer among
// resps (the EPP's, or the sidecar's own), after what it already sets:
// the filters have the last word on the headers they name.
func (f *requestFilters) applyTo(resps []*extprocv3.ProcessingResponse, header func(string) string, matchedPrefix string) {
	for _, r := range resps {
		rh := r.GetRequestHeaders()
		if rh == nil {
			continue
		}
		if rh.Response == nil {
			rh.Response = &extprocv3.CommonResponse{}
		}
		m := f.mutation(header, matchedPrefix)
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
