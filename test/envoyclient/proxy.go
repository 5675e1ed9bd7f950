package envoyclient

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
	"sync"

	"github.com/google/uuid"
	"k8s.io/klog/v2"
)

// Proxy is a tiny Envoy-like gateway, a test double: for each HTTP request it
// asks an ext_proc server (an Endpoint Picker) through Client where the
// request goes, then forwards the request as the server left it (headers
// mutated, body streamed back) to the destination, and runs the response
// through the same stream (Exchange.Respond: the headers, the body as it
// streams from the upstream, the trailers, with the endpoint that served
// it) before it goes to the caller as the server left it. An immediate
// response of the server goes back to the caller as it is. The stream ends
// when the response has gone through, and is reset when the caller goes
// away first, as Envoy resets it.
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
		Rewrite:        rewrite,
		Transport:      &fallbackTransport{next: transport},
		ModifyResponse: respond,
		// Each piece of the body goes on as the server streams it back.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			klog.FromContext(r.Context()).V(2).Info("Forwarding to the destination failed", "err", err)
			var ir *immediateError
			if errors.As(err, &ir) {
				writeImmediate(w, ir.resp)
				return
			}
			http.Error(w, "upstream connect error: "+err.Error(), http.StatusBadGateway)
		},
	}
	return p
}

type decisionKey struct{}

// decision is what the proxy knows of a request it forwards.
type decision struct {
	res *Result
	x   *Exchange
	// served is the endpoint that answered: the destination or a
	// fallback.
	mu     sync.Mutex
	served string
}

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

	x, err := p.client.Start(r.Context(), req)
	var res *Result
	if x != nil {
		res = x.Result
	}
	switch {
	case errors.Is(err, ErrMessageTimeout):
		http.Error(w, "ext_proc message timeout", http.StatusGatewayTimeout)
		return
	case err != nil:
		klog.FromContext(r.Context()).V(2).Info("ext_proc failed", "err", err)
		http.Error(w, "ext_proc error: "+err.Error(), http.StatusInternalServerError)
		return
	case res.Immediate != nil:
		writeImmediate(w, res.Immediate)
		return
	case res.Destination == "":
		x.Close()
		http.Error(w, "no healthy upstream: the endpoint picker named no destination", http.StatusServiceUnavailable)
		return
	}
	d := &decision{res: res, x: x}
	// Until the response has gone through (respond's streamer closes the
	// exchange), a caller that goes away resets the stream.
	defer func() {
		if d.x != nil {
			d.x.Reset()
		}
	}()
	p.reverse.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), decisionKey{}, d)))
}

func writeImmediate(w http.ResponseWriter, ir *ImmediateResponse) {
	for k, vs := range ir.Headers {
		w.Header()[k] = vs
	}
	w.WriteHeader(ir.StatusCode)
	_, _ = w.Write(ir.Body)
}

// immediateError carries an immediate response of the response phase to
// the ErrorHandler.
type immediateError struct{ resp *ImmediateResponse }

func (e *immediateError) Error() string { return "immediate response in the response phase" }

// respond runs the upstream's response through the exchange: it waits for
// the answer to the headers, then passes the body on as the server streams
// it back. The exchange is the streamer's from here: it closes it once the
// response is through and resets it when the reader of the body stops.
func respond(resp *http.Response) error {
	d := resp.Request.Context().Value(decisionKey{}).(*decision)
	x := d.x
	d.x = nil
	d.mu.Lock()
	served := d.served
	d.mu.Unlock()
	headers := resp.Header.Clone()
	for _, h := range hopByHop {
		headers.Del(h)
	}
	var trailers http.Header
	if len(resp.Trailer) > 0 {
		trailers = http.Header{}
	}
	pr, pw := io.Pipe()
	sink := &pipeSink{headers: make(chan headersAnswer, 1), body: pw, trailer: resp.Trailer}
	upstream := resp.Body
	go func() {
		ir, err := x.Respond(Response{
			Status: resp.StatusCode, Headers: headers, BodyReader: &trailerReader{r: upstream, from: resp, to: trailers},
			Trailers: trailers, Served: served,
		}, sink)
		_ = upstream.Close()
		if err == nil && ir != nil {
			err = &immediateError{resp: ir}
		}
		// The response goes out first; the stream closes after, as in
		// Envoy.
		sink.headers <- headersAnswer{err: err}
		_ = pw.CloseWithError(err)
		if err != nil {
			x.Reset()
		} else {
			x.Close()
		}
	}()
	a := <-sink.headers
	if a.err != nil {
		_ = pr.Close()
		return a.err
	}
	resp.StatusCode, resp.Status = a.status, ""
	resp.Header = a.headers
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Body = pr
	return nil
}

// trailerReader reads an upstream body and, at its end, copies the
// upstream's trailers (known only then) into to.
type trailerReader struct {
	r    io.Reader
	from *http.Response
	to   http.Header
}

func (t *trailerReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err == io.EOF && t.to != nil {
		for k, vs := range t.from.Trailer {
			t.to[k] = vs
		}
	}
	return n, err
}

type headersAnswer struct {
	status  int
	headers http.Header
	err     error
}

// pipeSink passes the response on: the headers to respond, the body into
// the pipe the ReverseProxy copies to the caller, the trailers into the
// response's trailers, which the ReverseProxy sends after the body.
type pipeSink struct {
	headers chan headersAnswer
	body    *io.PipeWriter
	trailer http.Header
}

func (s *pipeSink) WriteHeaders(status int, h http.Header) error {
	s.headers <- headersAnswer{status: status, headers: h}
	return nil
}

func (s *pipeSink) WriteBody(chunk []byte) error {
	_, err := s.body.Write(chunk)
	return err
}

func (s *pipeSink) WriteTrailers(h http.Header) error {
	for k := range s.trailer {
		s.trailer[k] = h[k]
	}
	return nil
}

// rewrite makes the outgoing request the one the ext_proc server left.
func rewrite(pr *httputil.ProxyRequest) {
	res := pr.In.Context().Value(decisionKey{}).(*decision).res
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
	d, _ := req.Context().Value(decisionKey{}).(*decision)
	resp, err := t.next.RoundTrip(req)
	if d == nil {
		return resp, err
	}
	res := d.res
	served := req.URL.Host
	defer func() {
		d.mu.Lock()
		d.served = served
		d.mu.Unlock()
	}()
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
		served = fb
	}
	return resp, err
}
