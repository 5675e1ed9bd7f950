package sidecar

import (
	"net/http"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	extproctest "github.com/mci-dev/mci/test/extproc"
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
			assert.Equal(t, tc.want, f.location(getter(req), "/"))
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
		m := f.mutation(getter(map[string]string{":path": "/api/chat", ":authority": "llm.example"}), "/api")
		assert.Equal(t, map[string]string{
			"x-tier:OVERWRITE_IF_EXISTS_OR_ADD":     "gold",
			"x-via:APPEND_IF_EXISTS_OR_ADD":         "mci",
			":authority:OVERWRITE_IF_EXISTS_OR_ADD": "backend.internal",
			":path:OVERWRITE_IF_EXISTS_OR_ADD":      "/v1/chat",
		}, setHeaders(m))
		assert.Equal(t, []string{"x-debug"}, m.RemoveHeaders)
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

// setHeaders flattens a mutation's set headers to "name:action" -> value.
func setHeaders(m *extprocv3.HeaderMutation) map[string]string {
	out := map[string]string{}
	for _, h := range m.GetSetHeaders() {
		out[h.GetHeader().GetKey()+":"+h.GetAppendAction().String()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

func getter(headers map[string]string) func(string) string {
	return func(name string) string { return headers[name] }
}

// ruleOf is the rule a request matches, nil for none.
func ruleOf(t *Table, a *RequestAttrs) *Rule {
	rule, _ := t.Match(a)
	return rule
}

// The sidecar applies the filters of the rule and of the backendRef it
// picked, after the EPP's own mutations; a redirect answers without an
// EPP; a filter it cannot apply fails the rule with 500.
func TestServerAppliesHTTPRouteFilters(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	ah, ap := hostPort(t, a.addr)
	ch, cp := hostPort(t, c.addr)
	imp := importOf("llm", imported{name: "cluster-a", addr: ah, port: ap})
	other := importOf("other", imported{name: "cluster-c", addr: ch, port: cp})

	modified := rule([]gatewayv1.HTTPRouteMatch{prefix("/api")}, importRef("llm", ptr.To[int32](1)), importRef("other", ptr.To[int32](0)))
	modified.Filters = []gatewayv1.HTTPRouteFilter{
		{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
			Set: []gatewayv1.HTTPHeader{{Name: "X-Picked-By", Value: "the route"}}, Remove: []string{"X-Debug"}}},
	}
	modified.BackendRefs[0].Filters = []gatewayv1.HTTPRouteFilter{
		{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
			Hostname: ptr.To(gatewayv1.PreciseHostname("llm.internal")),
			Path:     &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v1")}}},
	}
	redirected := rule([]gatewayv1.HTTPRouteMatch{prefix("/old")})
	redirected.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
		Scheme: ptr.To("https"), Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}, StatusCode: ptr.To(301)}}}
	mirrored := rule([]gatewayv1.HTTPRouteMatch{prefix("/mirrored")}, importRef("llm", nil))
	mirrored.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{}}}

	h := startServer(t, Inputs{
		Routes:  []*gatewayv1.HTTPRoute{route("r", 0, []string{"my.model.com"}, modified, redirected, mirrored)},
		Imports: []*v1alphaImport{imp, other},
	}, &fakeState{})

	t.Run("header modifier and rewrite", func(t *testing.T) {
		res := h.do(t, extproctest.Request{Authority: "my.model.com", Path: "/api/chat/completions?stream=true", Body: chatBody,
			Headers: http.Header{"X-Debug": {"1"}}})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.1.0.1:8000", res.Destination, "the EPP still picks the endpoint")
		assert.Equal(t, "/v1/chat/completions?stream=true", res.Headers.Get(":path"))
		assert.Equal(t, "llm.internal", res.Headers.Get(":authority"))
		assert.Equal(t, "the route", res.Headers.Get("x-picked-by"), "the route's filter overrides the EPP's header")
		assert.Empty(t, res.Headers.Values("x-debug"))
		assert.Equal(t, "/api/chat/completions?stream=true", a.lastPath(), "the EPP sees the request as the client sent it")
	})
	t.Run("redirect", func(t *testing.T) {
		calls := a.calls.Load() + c.calls.Load()
		res := h.do(t, extproctest.Request{Authority: "my.model.com", Path: "/old/models", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusMovedPermanently, res.Immediate.StatusCode)
		assert.Equal(t, "https://my.model.com/new/models", res.Immediate.Headers.Get("location"))
		assert.Equal(t, calls, a.calls.Load()+c.calls.Load(), "no EPP is asked")
	})
	t.Run("a filter the sidecar cannot apply", func(t *testing.T) {
		res := h.do(t, extproctest.Request{Authority: "my.model.com", Path: "/mirrored", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusInternalServerError, res.Immediate.StatusCode)
		assert.Contains(t, res.Immediate.Details, "RequestMirror")
	})
}
