package clusterset

import (
	"fmt"
	"io"
	"net/http"
)

// boundResponses is a rest.Config WrapTransport that caps the body of
// every response from a member at limit bytes: a list, a discovery
// answer, a probe or a watch stream. Past the cap the body reads fail as a
// broken connection would. A list or answer that large is the member
// sending more than it may, and tooLarge is told (the member is frozen: it
// would never list within its limits). A watch that has carried that much
// over its life is only ended, and client-go resumes it from its last
// resourceVersion on a new request; that holds for a watch that began by
// streaming the initial list too, because such a stream goes on as an
// ordinary watch for as long as it lives, and a busy member's ordinary
// changes must not freeze it. Its initial events are counted by the
// list-time limits (listquota.go) instead, and a stream ended here before
// they are done makes client-go fall back to a paged LIST, whose pages
// this cap bounds. client-go already refuses a single watch event over
// 16 MiB; this bounds what one response can make this server decode and
// hold.
func boundResponses(limit int64, tooLarge func(error)) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return boundedTransport{next: rt, limit: limit, tooLarge: tooLarge}
	}
}

type boundedTransport struct {
	next     http.RoundTripper
	limit    int64
	tooLarge func(error)
}

func (t boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	if resp.ContentLength > t.limit {
		_ = resp.Body.Close()
		err := fmt.Errorf("the response to %s %s is %d bytes, more than the %d a member may send in one (--member-max-response-bytes)", req.Method, req.URL.Path, resp.ContentLength, t.limit)
		t.tooLarge(err)
		return nil, err
	}
	body := &boundedBody{ReadCloser: resp.Body, left: t.limit, method: req.Method, path: req.URL.Path, limit: t.limit, tooLarge: t.tooLarge}
	if q := req.URL.Query(); q.Get("watch") == "true" || q.Get("watch") == "1" {
		body.tooLarge = nil
	}
	resp.Body = body
	return resp, nil
}

// boundedBody fails its reads once more than limit bytes were read. It
// names the request by its method and path rather than keeping it: a
// watch's body lives for minutes, and the request with it, its headers
// and URL, about 1.5 KiB each of a member's two.
type boundedBody struct {
	io.ReadCloser
	left         int64
	limit        int64
	method, path string
	tooLarge     func(error)
	err          error
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	// One byte past the limit tells a body of exactly limit bytes from a
	// longer one.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		b.err = fmt.Errorf("the response to %s %s exceeds the %d bytes a member may send in one (--member-max-response-bytes)", b.method, b.path, b.limit)
		if b.tooLarge != nil {
			b.tooLarge(b.err)
		}
		return n + int(b.left), b.err
	}
	return n, err
}
