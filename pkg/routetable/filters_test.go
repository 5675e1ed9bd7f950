package routetable

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestRewritePath(t *testing.T) {
	tests := []struct {
		name          string
		mod           pathModifier
		path, matched string
		want          string
	}{
		{"full path", pathModifier{full: ptr.To("/v1/completions")}, "/anything/else?x=1", "/", "/v1/completions?x=1"},
		{"prefix to prefix", pathModifier{prefix: ptr.To("/bar")}, "/foo/baz", "/foo", "/bar/baz"},
		{"prefix with trailing slash", pathModifier{prefix: ptr.To("/bar/")}, "/foo/baz", "/foo/", "/bar/baz"},
		{"prefix to root", pathModifier{prefix: ptr.To("/")}, "/foo/baz", "/foo", "/baz"},
		{"the whole prefix to root", pathModifier{prefix: ptr.To("/")}, "/foo", "/foo", "/"},
		{"the whole prefix to another", pathModifier{prefix: ptr.To("/bar")}, "/foo", "/foo", "/bar"},
		{"root match", pathModifier{prefix: ptr.To("/api")}, "/v1/models", "/", "/api/v1/models"},
		{"query kept", pathModifier{prefix: ptr.To("/bar")}, "/foo/x?a=b&c=d", "/foo", "/bar/x?a=b&c=d"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.mod.rewritePath(tc.path, tc.matched))
		})
	}
}

func TestRedirectLocation(t *testing.T) {
	redirectFilter := func(r gatewayv1.HTTPRequestRedirectFilter) []gatewayv1.HTTPRouteFilter {
		return []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &r}}
	}
	req := map[string]string{":scheme": "http", ":authority": "llm.example:8080", ":path": "/v1/chat?stream=1"}
	tests := []struct {
		name       string
		filter     gatewayv1.HTTPRequestRedirectFilter
		want       string
		wantStatus int
	}{
		{"defaults keep everything but answer 302", gatewayv1.HTTPRequestRedirectFilter{}, "http://llm.example:8080/v1/chat?stream=1", 302},
		{"a scheme drops the port", gatewayv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), StatusCode: ptr.To(301)}, "https://llm.example/v1/chat?stream=1", 301},
		{"a hostname keeps the port", gatewayv1.HTTPRequestRedirectFilter{Hostname: ptr.To(gatewayv1.PreciseHostname("other.example"))}, "http://other.example:8080/v1/chat?stream=1", 302},
		{"a well-known port is left out", gatewayv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), Port: ptr.To(gatewayv1.PortNumber(443))}, "https://llm.example/v1/chat?stream=1", 302},
		{"another port is kept", gatewayv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), Port: ptr.To(gatewayv1.PortNumber(8443))}, "https://llm.example:8443/v1/chat?stream=1", 302},
		{"a path", gatewayv1.HTTPRequestRedirectFilter{Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr.To("/moved")}}, "http://llm.example:8080/moved?stream=1", 302},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := compileFilters(redirectFilter(tc.filter))
			require.NoError(t, err)
			require.NotNil(t, f.redirect)
			assert.Equal(t, tc.want, f.Location(getter(req), "/"))
			assert.Equal(t, tc.wantStatus, f.redirect.status)
		})
	}
}

func TestCompileFilters(t *testing.T) {
	headers := func(set, add []gatewayv1.HTTPHeader, remove ...string) gatewayv1.HTTPRouteFilter {
		return gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier,
			RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: set, Add: add, Remove: remove}}
	}
	rewrite := gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
		Hostname: ptr.To(gatewayv1.PreciseHostname("backend.internal")),
		Path:     &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v1")},
	}}
	t.Run("no filters change nothing", func(t *testing.T) {
		f, err := compileFilters(nil, []gatewayv1.HTTPRouteFilter{})
		require.NoError(t, err)
		assert.Nil(t, f)
	})
	t.Run("the rule's filters, then the backendRef's, as one header mutation", func(t *testing.T) {
		f, err := compileFilters(
			[]gatewayv1.HTTPRouteFilter{headers([]gatewayv1.HTTPHeader{{Name: "X-Tier", Value: "gold"}}, nil, "X-Debug")},
			[]gatewayv1.HTTPRouteFilter{headers(nil, []gatewayv1.HTTPHeader{{Name: "X-Via", Value: "mci"}}), rewrite},
		)
		require.NoError(t, err)
		set, remove := f.Changes(getter(map[string]string{":path": "/api/chat", ":authority": "llm.example"}), "/api")
		assert.Equal(t, []Header{
			{Name: "x-tier", Value: "gold"},
			{Name: "x-via", Value: "mci", Append: true},
			{Name: ":authority", Value: "backend.internal"},
			{Name: ":path", Value: "/v1/chat"},
		}, set)
		assert.Equal(t, []string{"x-debug"}, remove)
	})
	for _, tc := range []struct {
		name    string
		filters []gatewayv1.HTTPRouteFilter
		wantErr string
	}{
		{"a filter the sidecar cannot apply", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror}}, "cannot apply the RequestMirror filter"},
		{"an external auth is never skipped", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterExternalAuth}}, "cannot apply the ExternalAuth filter"},
		{"a filter without its field", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite}}, "urlRewrite is missing"},
		{"a redirect with a rewrite", []gatewayv1.HTTPRouteFilter{rewrite, {Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{}}}, "cannot be combined"},
		{"a status code that is not a redirect", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{StatusCode: ptr.To(200)}}}, "not a redirect"},
		{"a path modifier without its value", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier}}}}, "without replaceFullPath"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compileFilters(tc.filters)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func getter(headers map[string]string) func(string) string {
	return func(name string) string { return headers[name] }
}

// ruleOf is the rule a request matches, nil for none.
func ruleOf(t *Table, a *RequestAttrs) *Rule {
	rule, _ := t.Match(a)
	return rule
}
