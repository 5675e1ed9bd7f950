package routetable

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// RequestAttrs are the parts of an HTTP request that HTTPRoute matches read.
type RequestAttrs struct {
	// Host is the request's host (":authority"), as sent: Match lowercases
	// it and drops a port and a trailing dot.
	Host string
	// Path is the path without the query.
	Path string
	// RawQuery is the query string, without "?".
	RawQuery string
	// Method is ":method".
	Method string
	// Headers are the request headers by lower-case name.
	Headers map[string][]string
}

// normalizeHost lowercases a request host and drops its port and a trailing
// dot: HTTPRoute hostnames never carry them and must match regardless.
func normalizeHost(h string) string {
	// Without a colon there is no port, and SplitHostPort would only build
	// an error to say so, for nearly every request.
	if strings.Contains(h, ":") {
		if host, _, err := net.SplitHostPort(h); err == nil {
			return strings.TrimSuffix(strings.ToLower(host), ".")
		}
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// pathKind orders path matches by precedence, most specific first.
type pathKind int8

const (
	pathExact pathKind = iota
	pathPrefix
	// pathRegex comes after prefixes: Gateway API leaves the precedence of
	// regular expressions to the implementation, and a regular expression
	// is the least predictable of the three.
	pathRegex
)

// matcher is one HTTPRouteMatch of one rule, compiled, with what orders it
// against the others.
type matcher struct {
	rule *Rule

	pathKind  pathKind
	pathValue string
	pathRE    *regexp.Regexp
	method    string
	headers   []valueMatcher
	query     []valueMatcher

	// Precedence beyond the match itself: the route's age and
	// namespace/name, then the rule's and the match's place in the route.
	routeCreated time.Time
	routeKey     string
	ruleIndex    int
	matchIndex   int
}

// valueMatcher matches one header (name lower-cased) or query parameter.
type valueMatcher struct {
	name  string
	value string
	re    *regexp.Regexp
}

func (v *valueMatcher) matches(got string) bool {
	if v.re != nil {
		return v.re.MatchString(got)
	}
	return got == v.value
}

// matches reports whether the request satisfies every condition of m.
// query is parsed lazily: most matches have no query conditions.
func (m *matcher) matches(a *RequestAttrs, query *url.Values) bool {
	switch m.pathKind {
	case pathExact:
		if a.Path != m.pathValue {
			return false
		}
	case pathPrefix:
		if !prefixMatches(m.pathValue, a.Path) {
			return false
		}
	case pathRegex:
		if !m.pathRE.MatchString(a.Path) {
			return false
		}
	}
	if m.method != "" && a.Method != m.method {
		return false
	}
	for i := range m.headers {
		h := &m.headers[i]
		values, ok := a.Headers[h.name]
		// Envoy matches a repeated header against its values joined by
		// commas, as HTTP allows combining them.
		if !ok || !h.matches(strings.Join(values, ",")) {
			return false
		}
	}
	if len(m.query) > 0 {
		if *query == nil {
			q, _ := url.ParseQuery(a.RawQuery)
			if q == nil {
				q = url.Values{}
			}
			*query = q
		}
		for i := range m.query {
			q := &m.query[i]
			values, ok := (*query)[q.name]
			// Gateway API: of repeated parameters, the first one counts.
			if !ok || !q.matches(values[0]) {
				return false
			}
		}
	}
	return true
}

// prefixMatches is PathPrefix matching element by element: "/abc" matches
// "/abc", "/abc/" and "/abc/def" but not "/abcd"; a trailing "/" of the
// prefix is ignored, so "/abc/" matches "/abc" too.
func prefixMatches(prefix, path string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" {
		return true
	}
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || path[len(prefix)] == '/'
}

// compareMatchers orders matchers by Gateway API precedence, the winner
// first: an Exact path, then the longest PathPrefix, then (implementation
// specific) regular expressions, longest first; then a method match, the
// most header matches, the most query parameter matches; then the oldest
// route, the route first by namespace/name; then the first rule and match
// in list order.
func compareMatchers(a, b *matcher) int {
	if c := cmp.Compare(a.pathKind, b.pathKind); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.pathValue), len(a.pathValue)); c != 0 {
		return c
	}
	if c := cmp.Compare(b2i(b.method != ""), b2i(a.method != "")); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.headers), len(a.headers)); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.query), len(a.query)); c != 0 {
		return c
	}
	if c := a.routeCreated.Compare(b.routeCreated); c != 0 {
		return c
	}
	if c := strings.Compare(a.routeKey, b.routeKey); c != 0 {
		return c
	}
	if c := cmp.Compare(a.ruleIndex, b.ruleIndex); c != 0 {
		return c
	}
	return cmp.Compare(a.matchIndex, b.matchIndex)
}

// hostIndex finds the matchers that apply to a host, in precedence order.
// Gateway API gives precedence first to the route with the longest matching
// non-wildcard hostname, then to the longest matching hostname: so exact
// hostnames come first, then wildcards from the longest suffix, then routes
// without hostnames (which match any host with no characters). Within each
// group the matchers are sorted by compareMatchers.
type hostIndex struct {
	exact     map[string][]*matcher
	wildcards []wildcardGroup
	any       []*matcher
}

type wildcardGroup struct {
	// suffix is the wildcard hostname without "*": ".example.com".
	suffix   string
	matchers []*matcher
}

func (h *hostIndex) add(hostname string, m *matcher) {
	hostname = strings.ToLower(hostname)
	switch {
	case hostname == "":
		h.any = append(h.any, m)
	case strings.HasPrefix(hostname, "*."):
		suffix := hostname[1:]
		for i := range h.wildcards {
			if h.wildcards[i].suffix == suffix {
				h.wildcards[i].matchers = append(h.wildcards[i].matchers, m)
				return
			}
		}
		h.wildcards = append(h.wildcards, wildcardGroup{suffix: suffix, matchers: []*matcher{m}})
	default:
		if h.exact == nil {
			h.exact = map[string][]*matcher{}
		}
		h.exact[hostname] = append(h.exact[hostname], m)
	}
}

// match returns the winning matcher for a request, nil when none matches.
func (h *hostIndex) match(a *RequestAttrs) *matcher {
	host := normalizeHost(a.Host)
	var query url.Values
	for _, m := range h.exact[host] {
		if m.matches(a, &query) {
			return m
		}
	}
	for _, g := range h.wildcards {
		if len(host) <= len(g.suffix) || !strings.HasSuffix(host, g.suffix) {
			continue
		}
		for _, m := range g.matchers {
			if m.matches(a, &query) {
				return m
			}
		}
	}
	for _, m := range h.any {
		if m.matches(a, &query) {
			return m
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// compileMatch turns an HTTPRouteMatch into a matcher, with the API's
// defaults (PathPrefix "/", Exact header and query matches).
func compileMatch(m gatewayv1.HTTPRouteMatch) (*matcher, error) {
	mt := &matcher{pathKind: pathPrefix, pathValue: "/"}
	if p := m.Path; p != nil {
		if err := mt.compilePath(p); err != nil {
			return nil, err
		}
	}
	if m.Method != nil {
		mt.method = string(*m.Method)
	}
	seen := map[string]bool{}
	for _, h := range m.Headers {
		name := strings.ToLower(string(h.Name))
		if seen[name] {
			// Gateway API: only the first entry of a name counts.
			continue
		}
		seen[name] = true
		vm, err := valueMatch(name, h.Value, h.Type == nil || *h.Type == gatewayv1.HeaderMatchExact,
			h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", h.Name, err)
		}
		mt.headers = append(mt.headers, vm)
	}
	seen = map[string]bool{}
	for _, q := range m.QueryParams {
		name := string(q.Name)
		if seen[name] {
			continue
		}
		seen[name] = true
		vm, err := valueMatch(name, q.Value, q.Type == nil || *q.Type == gatewayv1.QueryParamMatchExact,
			q.Type != nil && *q.Type == gatewayv1.QueryParamMatchRegularExpression)
		if err != nil {
			return nil, fmt.Errorf("query parameter %s: %w", q.Name, err)
		}
		mt.query = append(mt.query, vm)
	}
	return mt, nil
}

// compilePath sets the matcher's path match, the API's PathPrefix when p
// has no type.
func (mt *matcher) compilePath(p *gatewayv1.HTTPPathMatch) error {
	if p.Value != nil {
		mt.pathValue = *p.Value
	}
	typ := gatewayv1.PathMatchPathPrefix
	if p.Type != nil {
		typ = *p.Type
	}
	switch typ {
	case gatewayv1.PathMatchExact:
		mt.pathKind = pathExact
	case gatewayv1.PathMatchPathPrefix:
		mt.pathKind = pathPrefix
	case gatewayv1.PathMatchRegularExpression:
		re, err := regexp.Compile(`^(?:` + mt.pathValue + `)$`)
		if err != nil {
			return fmt.Errorf("path regular expression %q: %w", mt.pathValue, err)
		}
		mt.pathKind, mt.pathRE = pathRegex, re
	default:
		return fmt.Errorf("unknown path match type %q", typ)
	}
	if mt.pathKind != pathRegex && !strings.HasPrefix(mt.pathValue, "/") {
		return fmt.Errorf("path %q does not start with /", mt.pathValue)
	}
	return nil
}

func valueMatch(name, value string, exact, regex bool) (valueMatcher, error) {
	switch {
	case exact:
		return valueMatcher{name: name, value: value}, nil
	case regex:
		re, err := regexp.Compile(`^(?:` + value + `)$`)
		if err != nil {
			return valueMatcher{}, fmt.Errorf("regular expression %q: %w", value, err)
		}
		return valueMatcher{name: name, re: re}, nil
	default:
		return valueMatcher{}, fmt.Errorf("unknown match type")
	}
}
