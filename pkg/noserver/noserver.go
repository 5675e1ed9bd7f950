// Package noserver holds the one rule by which mci's informers meet a
// server that is not there to answer yet: a List or Watch that finds no
// server (a refused connection, or 503 from a kube-apiserver that is
// starting or an aggregator whose API server is down) is made again
// inside the call, every 250 ms to 1 s, until it answers.
//
// client-go's reflector would return the error instead: it lists again
// after most errors, and retries a refused watch only after its own
// backoff, which grows to 30 s. Either way a restarted server is read late
// or read whole again. Retried in the call, a watch resumes from the
// resourceVersion it was asked for as soon as the server answers, and the
// reflector never learns that the server was away: nothing is listed
// again. The price is at most a few cheap requests a second per informer
// while its server is away.
//
// The clients of those informers carry WithoutRetryAfter: client-go's REST
// client would otherwise wait out, inside the call, the Retry-After of a
// 503 (a kube-apiserver that is starting asks for 5 s), and the call would
// answer seconds after the server could.
package noserver

import (
	"context"
	"math"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
)

// backoff paces the calls that find no server: jittered, doubling from
// 250 ms to its cap of 1 s, well under client-go's 30 s.
var backoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: time.Second}

// Is tells the errors of a server that is not there to answer yet: a
// refused connection, or 503 (a kube-apiserver that is starting, an
// aggregated API whose server is not available).
func Is(err error) bool {
	return err != nil && (utilnet.IsConnectionRefused(err) || apierrors.IsServiceUnavailable(err))
}

// Retry makes call until its error is not one of no server (Is), or ctx
// ends; it returns the last outcome. retrying, if not nil, is told each
// error of no server and the pause before the next call.
func Retry[T any](ctx context.Context, call func() (T, error), retrying func(err error, pause time.Duration)) (T, error) {
	delay := backoff.DelayFunc()
	for {
		out, err := call()
		if !Is(err) || ctx.Err() != nil {
			return out, err
		}
		pause := delay()
		if retrying != nil {
			retrying(err, pause)
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(pause):
		}
	}
}

// WithoutRetryAfter is a rest.Config WrapTransport that takes the
// Retry-After header off a 503 answer, so that client-go hands the answer
// back at once rather than sleeping for it and asking again up to ten
// times, and Retry asks again at its own pace. A 429 keeps its
// Retry-After: it is a server's flow control, which the client obeys.
func WithoutRetryAfter(rt http.RoundTripper) http.RoundTripper {
	return withoutRetryAfter{rt}
}

type withoutRetryAfter struct{ next http.RoundTripper }

func (w withoutRetryAfter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(req)
	if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
		resp.Header.Del("Retry-After")
	}
	return resp, err
}

// WrappedRoundTripper lets client-go's transport helpers see through it.
func (w withoutRetryAfter) WrappedRoundTripper() http.RoundTripper { return w.next }
