package routetable

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Filters are what the HTTPRoute filters of a rule, and of the
// backendRef the sidecar picked in it, do to a request. The sidecar applies
// them because only it knows which backendRef a request goes to; the
// gateway forwards the request as the ext_proc answer mutates it.
//
// What an ext_proc answer can do is supported: RequestHeaderModifier,
// URLRewrite and RequestRedirect. A filter the sidecar cannot apply
// (ResponseHeaderModifier, RequestMirror, CORS, ExternalAuth, ExtensionRef)
// makes its rule answer 500 rather than route without it: skipping an
// authentication or a header the backend relies on must not go unnoticed.
type Filters struct {
	setHeaders    []Header
	addHeaders    []Header
	removeHeaders []string
	// hostname replaces the request's host (URLRewrite).
	hostname string
	// path is the URLRewrite's, or the RequestRedirect's: the API allows
	// one of the two per rule.
	path     *pathModifier
	rewrites bool
	redirect *redirect
}

// Header is a request header a filter sets, or with Append adds a value
// to, keeping the values it has.
type Header struct {
	Name, Value string
	Append      bool
}

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
func (f *Filters) empty() bool {
	return f == nil || (len(f.setHeaders) == 0 && len(f.addHeaders) == 0 && len(f.removeHeaders) == 0 &&
		f.hostname == "" && f.path == nil && f.redirect == nil)
}

// compileFilters turns a rule's filters, then a backendRef's, into
// Filters. An error says why the rule cannot be served.
func compileFilters(lists ...[]gatewayv1.HTTPRouteFilter) (*Filters, error) {
	f := &Filters{}
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

func (f *Filters) add(filter gatewayv1.HTTPRouteFilter) error {
	switch filter.Type {
	case gatewayv1.HTTPRouteFilterRequestHeaderModifier:
		m := filter.RequestHeaderModifier
		if m == nil {
			return fmt.Errorf("requestHeaderModifier is missing")
		}
		for _, h := range m.Set {
			f.setHeaders = append(f.setHeaders, Header{Name: strings.ToLower(string(h.Name)), Value: h.Value})
		}
		for _, h := range m.Add {
			f.addHeaders = append(f.addHeaders, Header{Name: strings.ToLower(string(h.Name)), Value: h.Value, Append: true})
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
		return f.addRedirect(filter.RequestRedirect)
	default:
		return fmt.Errorf("mci-sidecar cannot apply the %s filter: requests of the rule get 500 rather than skip it", filter.Type)
	}
}

// addRedirect adds a RequestRedirect filter, r (nil: missing).
func (f *Filters) addRedirect(r *gatewayv1.HTTPRequestRedirectFilter) error {
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

// Changes returns what the filters do to the headers of a request whose
// headers (":path", ":authority", ":scheme" among them) header gives and
// whose rule matched matchedPrefix, in the order they apply: the headers
// set or added, and those removed. Not for a redirect, which answers
// instead.
func (f *Filters) Changes(header func(string) string, matchedPrefix string) (set []Header, remove []string) {
	set = make([]Header, 0, len(f.setHeaders)+len(f.addHeaders)+2)
	set = append(append(set, f.setHeaders...), f.addHeaders...)
	if f.hostname != "" {
		set = append(set, Header{Name: ":authority", Value: f.hostname})
	}
	if f.path != nil {
		set = append(set, Header{Name: ":path", Value: f.path.rewritePath(header(":path"), matchedPrefix)})
	}
	return set, f.removeHeaders
}

// RedirectStatus is the status code of the filters' RequestRedirect; 0
// when they do not redirect.
func (f *Filters) RedirectStatus() int {
	if f == nil || f.redirect == nil {
		return 0
	}
	return f.redirect.status
}

// Location is where a redirect sends a request with headers whose rule
// matched matchedPrefix, following the Gateway API's rules: the scheme,
// host and path of the request unless the filter replaces them, and a port
// only when it is not the scheme's well-known one.
func (f *Filters) Location(header func(string) string, matchedPrefix string) string {
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
