package extproc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/google/uuid"
	"k8s.io/klog/v2"
)

// Proxy is a tiny Envoy-like gateway, a test double: for each HTTP request it
// asks an ext_proc server (an Endpoint Picker) through Client where the
// request goes, then forwards the request as the server left it (headers
// mutated, body streamed back) to the destination and returns the response.
// An immediate response of the server goes back to the caller as it is.
//
// As Envoy with a retry policy on connect failures, a destination that
// refuses the connection is followed by the fallbacks in order. What Envoy
// answers itself, Proxy answers alike: 500 when the ext_proc stream fails,
// 504 on a message timeout, 503 when the server names no destination, 502
// when the destination cannot be reached.
type Proxy struct {
	client  *Client
	reverse *httputil.ReverseProxy
}

// NewProxy returns a proxy that asks client. transport carries the
// forwarded requests; nil means a transport of its own that ignores
// HTTP_PROXY settings (destinations are pod addresses).
func NewProxy(client *Client, transport http.RoundTripper) *Proxy {
	if transport == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		transport = tr
	}
	p := &Proxy{client: client}
	p.reverse = &httputil.ReverseProxy{
		Rewrite:   rewrite,
		Transport: &fallbackTransport{next: transport},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			klog.FromContext(r.Context()).V(2).Info("Forwarding to the destination failed", "err", err)
			http.Error(w, "upstream connect error: "+err.Error(), http.StatusBadGateway)
		},
	}
	return p
}

type decisionKey struct{}

// hopByHop are the connection-specific headers Envoy does not pass on.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// ServeHTTP asks the ext_proc server about r and forwards it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	headers := r.Header.Clone()
	for _, h := range hopByHop {
		headers.Del(h)
	}
	if headers.Get("X-Request-Id") == "" {
		// Envoy generates one.
		headers.Set("X-Request-Id", uuid.NewString())
	}
	req := Request{Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host, Headers: headers}
	if r.ContentLength > 0 {
		headers.Set("Content-Length", strconv.FormatInt(r.ContentLength, 10))
	}
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		req.BodyReader = r.Body
	}

	res, err := p.client.Do(r.Context(), req)
	switch {
	case errors.Is(err, ErrMessageTimeout):
		http.Error(w, "ext_proc message timeout", http.StatusGatewayTimeout)
		return
	case err != nil:
		klog.FromContext(r.Context()).V(2).Info("ext_proc failed", "err", err)
		http.Error(w, "ext_proc error: "+err.Error(), http.StatusInternalServerError)
		return
	case res.Immediate != nil:
		for k, vs := range res.Immediate.Headers {
			w.Header()[k] = vs
		}
		w.WriteHeader(res.Immediate.StatusCode)
		_, _ = w.Write(res.Immediate.Body)
		return
	case res.Destination == "":
		http.Error(w, "no healthy upstream: the endpoint picker named no destination", http.StatusServiceUnavailable)
		return
	}
	p.reverse.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), decisionKey{}, res)))
}

// rewrite makes the outgoing request the one the ext_proc server left.
func rewrite(pr *httputil.ProxyRequest) {
	res := pr.In.Context().Value(decisionKey{}).(*Result)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = res.Destination
	if u, err := url.ParseRequestURI(res.Headers.Get(":path")); err == nil {
		out.URL.Path, out.URL.RawPath, out.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
	}
	out.Host = res.Headers.Get(":authority")
	out.Method = res.Headers.Get(":method")
	out.Header = http.Header{}
	for k, vs := range res.Headers {
		if k != "" && k[0] != ':' {
			out.Header[k] = vs
		}
	}
	out.Header.Del("Content-Length")
	body := res.Body
	out.ContentLength = int64(len(body))
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		out.Body, out.GetBody = http.NoBody, nil
	}
}

// fallbackTransport tries the destination's fallbacks in order when a
// connection cannot be made.
type fallbackTransport struct {
	next http.RoundTripper
}

func (t *fallbackTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, _ := req.Context().Value(decisionKey{}).(*Result)
	resp, err := t.next.RoundTrip(req)
	if res == nil {
		return resp, err
	}
	for _, fb := range res.Fallbacks {
		var op *net.OpError
		if err == nil || !errors.As(err, &op) || op.Op != "dial" {
			break
		}
		retry := req.Clone(req.Context())
		retry.URL.Host = fb
		if req.GetBody != nil {
			if retry.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		resp, err = t.next.RoundTrip(retry)
	}
	return resp, err
}
