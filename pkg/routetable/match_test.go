package routetable

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestPrefixMatches(t *testing.T) {
	tests := []struct {
		prefix, path string
		want         bool
	}{
		{"/abc", "/abc", true},
		{"/abc", "/abc/", true},
		{"/abc", "/abc/def", true},
		{"/abc", "/abcd", false},
		{"/abc/", "/abc", true},
		{"/abc/", "/abc/def", true},
		{"/abc/", "/abcd", false},
		{"/", "/anything", true},
		{"/", "/", true},
		{"/v1/completions", "/v1/chat/completions", false},
		{"/abc", "/ABC", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s on %s", tt.prefix, tt.path), func(t *testing.T) {
			assert.Equal(t, tt.want, prefixMatches(tt.prefix, tt.path))
		})
	}
}

func TestNormalizeHost(t *testing.T) {
	for in, want := range map[string]string{
		"My.Model.COM":      "my.model.com",
		"my.model.com:8080": "my.model.com",
		"my.model.com.":     "my.model.com",
		"[::1]:80":          "::1",
		"[::1]":             "::1",
		"::1":               "::1",
		"Model.COM.:8080":   "model.com",
		"":                  "",
	} {
		assert.Equal(t, want, normalizeHost(in), in)
	}
}

func TestMatch(t *testing.T) {
	backend := poolRef("p", nil)
	r := func(name string, age time.Duration, hosts []string, matches ...[]gatewayv1.HTTPRouteMatch) *gatewayv1.HTTPRoute {
		var rules []gatewayv1.HTTPRouteRule
		for _, m := range matches {
			rules = append(rules, rule(m, backend))
		}
		return route(name, age, hosts, rules...)
	}
	ms := func(m ...gatewayv1.HTTPRouteMatch) []gatewayv1.HTTPRouteMatch { return m }
	req := func(host, path string, headers ...string) RequestAttrs {
		a := RequestAttrs{Host: host, Method: "POST", Headers: map[string][]string{}}
		a.Path, a.RawQuery, _ = cut(path)
		for i := 0; i < len(headers); i += 2 {
			a.Headers[headers[i]] = append(a.Headers[headers[i]], headers[i+1])
		}
		return a
	}

	tests := []struct {
		name   string
		routes []*gatewayv1.HTTPRoute
		req    RequestAttrs
		want   string // "route#rule", "" for no match
	}{
		{
			name:   "a rule without matches matches every path",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, nil)},
			req:    req("x", "/v1/completions"),
			want:   "a#0",
		},
		{
			name:   "nothing matches a path outside every prefix",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(prefix("/v1")))},
			req:    req("x", "/v2/completions"),
			want:   "",
		},
		{
			name:   "a prefix matches element by element, not by characters",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(prefix("/v1")))},
			req:    req("x", "/v1beta/completions"),
			want:   "",
		},
		{
			name:   "an exact path beats a longer prefix",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(prefix("/v1/completions/long")), ms(exact("/v1/completions")), ms(prefix("/v1")))},
			req:    req("x", "/v1/completions"),
			want:   "a#1",
		},
		{
			name:   "an exact path does not match a trailing slash",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(exact("/v1/completions")), ms(prefix("/")))},
			req:    req("x", "/v1/completions/"),
			want:   "a#1",
		},
		{
			name:   "the longest prefix wins across routes",
			routes: []*gatewayv1.HTTPRoute{r("old", 0, nil, ms(prefix("/v1"))), r("new", time.Hour, nil, ms(prefix("/v1/chat")))},
			req:    req("x", "/v1/chat/completions"),
			want:   "new#0",
		},
		{
			name:   "a prefix beats a regular expression",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(regex("/v1/.*")), ms(prefix("/v1")))},
			req:    req("x", "/v1/completions"),
			want:   "a#1",
		},
		{
			name:   "a regular expression matches the whole path",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(regex("/v[0-9]+/completions")))},
			req:    req("x", "/v12/completions/more"),
			want:   "",
		},
		{
			name:   "a regular expression matches",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(regex("/v[0-9]+/completions")))},
			req:    req("x", "/v12/completions"),
			want:   "a#0",
		},
		{
			name:   "with equal paths, a method match wins",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(prefix("/v1")), ms(withMethod(prefix("/v1"), "POST")))},
			req:    req("x", "/v1/completions"),
			want:   "a#1",
		},
		{
			name:   "a method match does not match another method",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(withMethod(prefix("/v1"), "GET")))},
			req:    req("x", "/v1/completions"),
			want:   "",
		},
		{
			name: "with equal paths, the most header matches win",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil,
				ms(withHeaders(prefix("/v1"), "x-tier", "gold")),
				ms(withHeaders(prefix("/v1"), "x-tier", "gold", "x-region", "eu")),
				ms(prefix("/v1")))},
			req:  req("x", "/v1/completions", "x-tier", "gold", "x-region", "eu"),
			want: "a#1",
		},
		{
			name: "a header match needs the header",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil,
				ms(withHeaders(prefix("/v1"), "x-tier", "gold")),
				ms(prefix("/v1")))},
			req:  req("x", "/v1/completions", "x-tier", "silver"),
			want: "a#1",
		},
		{
			name:   "header names are case-insensitive, values are not",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(withHeaders(prefix("/"), "X-Tier", "Gold")))},
			req:    req("x", "/v1/completions", "x-tier", "Gold"),
			want:   "a#0",
		},
		{
			name:   "a query parameter match",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(prefix("/")), ms(withQuery(prefix("/"), "canary", "yes")))},
			req:    req("x", "/v1/completions?canary=yes&x=1"),
			want:   "a#1",
		},
		{
			name:   "a path length beats header matches",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(withHeaders(prefix("/v1"), "x-tier", "gold")), ms(prefix("/v1/completions")))},
			req:    req("x", "/v1/completions", "x-tier", "gold"),
			want:   "a#1",
		},
		{
			name:   "on a tie the oldest route wins",
			routes: []*gatewayv1.HTTPRoute{r("b-new", time.Hour, nil, ms(prefix("/v1"))), r("z-old", 0, nil, ms(prefix("/v1")))},
			req:    req("x", "/v1/completions"),
			want:   "z-old#0",
		},
		{
			name:   "on a tie of age the first route by name wins",
			routes: []*gatewayv1.HTTPRoute{r("b", 0, nil, ms(prefix("/v1"))), r("a", 0, nil, ms(prefix("/v1")))},
			req:    req("x", "/v1/completions"),
			want:   "a#0",
		},
		{
			name:   "within a route the first rule wins a tie",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, nil, ms(prefix("/v1")), ms(prefix("/v1")))},
			req:    req("x", "/v1/completions"),
			want:   "a#0",
		},
		{
			name:   "a route for another host does not match",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, []string{"my.model.com"}, nil)},
			req:    req("other.com", "/v1"),
			want:   "",
		},
		{
			name:   "hosts match without case, port or trailing dot",
			routes: []*gatewayv1.HTTPRoute{r("a", 0, []string{"my.model.com"}, nil)},
			req:    req("My.Model.Com.:8080", "/v1"),
			want:   "a#0",
		},
		{
			name:   "an exact hostname beats a wildcard, even with a shorter path",
			routes: []*gatewayv1.HTTPRoute{r("wild", 0, []string{"*.model.com"}, ms(prefix("/v1/completions"))), r("exact", time.Hour, []string{"my.model.com"}, ms(prefix("/")))},
			req:    req("my.model.com", "/v1/completions"),
			want:   "exact#0",
		},
		{
			name:   "a longer wildcard beats a shorter one",
			routes: []*gatewayv1.HTTPRoute{r("short", 0, []string{"*.com"}, nil), r("long", time.Hour, []string{"*.model.com"}, nil)},
			req:    req("a.b.model.com", "/"),
			want:   "long#0",
		},
		{
			name:   "a wildcard does not match its own domain",
			routes: []*gatewayv1.HTTPRoute{r("wild", 0, []string{"*.model.com"}, nil)},
			req:    req("model.com", "/"),
			want:   "",
		},
		{
			name:   "a route without hostnames comes after every hostname",
			routes: []*gatewayv1.HTTPRoute{r("any", 0, nil, ms(exact("/v1/completions"))), r("wild", time.Hour, []string{"*.model.com"}, nil)},
			req:    req("my.model.com", "/v1/completions"),
			want:   "wild#0",
		},
		{
			name:   "a host whose routes match no path falls back to less specific hostnames",
			routes: []*gatewayv1.HTTPRoute{r("exact", 0, []string{"my.model.com"}, ms(prefix("/admin"))), r("any", time.Hour, nil, nil)},
			req:    req("my.model.com", "/v1/completions"),
			want:   "any#0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, _ := Build(Inputs{Routes: tt.routes})
			got, _ := tbl.Match(&tt.req)
			if tt.want == "" {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tt.want, fmt.Sprintf("%s#%d", got.Route.Name, got.Index))
		})
	}
}

func cut(pathAndQuery string) (string, string, bool) {
	for i := 0; i < len(pathAndQuery); i++ {
		if pathAndQuery[i] == '?' {
			return pathAndQuery[:i], pathAndQuery[i+1:], true
		}
	}
	return pathAndQuery, "", false
}
