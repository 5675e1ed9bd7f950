package noserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// refused is the error client-go returns for a request whose connection
// was refused.
func refused(path string) error {
	return &url.Error{Op: "Get", URL: "https://127.0.0.1:6443" + path, Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
}

func TestOnlyTheErrorsOfNoServerAreRetried(t *testing.T) {
	services := schema.GroupResource{Resource: "services"}
	tests := []struct {
		err  error
		want bool
	}{
		{refused("/api/v1/services"), true},
		{fmt.Errorf("failed to list *v1.Service: %w", refused("/api/v1/services")), true},
		{apierrors.NewServiceUnavailable("the server is currently unable to handle the request"), true},
		{apierrors.NewForbidden(services, "", errors.New("RBAC")), false},
		{apierrors.NewUnauthorized("token expired"), false},
		{apierrors.NewInternalError(errors.New("boom")), false},
		{apierrors.NewTooManyRequests("later", 1), false},
		{apierrors.NewResourceExpired("too old resource version"), false},
		{io.EOF, false},
		{nil, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Is(tt.err), "%v", tt.err)
	}
}

// TestACallIsMadeUntilAServerAnswers: a server away for three calls is
// asked again within the cap of 1 s (jittered to 1.5 s) each time, and its
// answer, whatever it is, ends the retries.
func TestACallIsMadeUntilAServerAnswers(t *testing.T) {
	for _, answer := range []error{nil, apierrors.NewResourceExpired("too old resource version")} {
		calls := 0
		var pauses []time.Duration
		got, err := Retry(context.Background(), func() (int, error) {
			calls++
			if calls <= 3 {
				return 0, apierrors.NewServiceUnavailable("service unavailable")
			}
			return calls, answer
		}, func(err error, pause time.Duration) {
			assert.True(t, apierrors.IsServiceUnavailable(err))
			pauses = append(pauses, pause)
		})
		assert.Equal(t, 4, got)
		assert.Equal(t, answer, err)
		assert.Len(t, pauses, 3, "each call that found no server is told")
		for _, p := range pauses {
			assert.Less(t, p, 1500*time.Millisecond)
		}
	}
}

// TestRetriesEndWithTheContext: a server that never comes back holds the
// call only until its context ends, which returns the last error.
func TestRetriesEndWithTheContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	calls := 0
	start := time.Now()
	_, err := Retry(ctx, func() (struct{}, error) {
		calls++
		return struct{}{}, refused("/apis")
	}, nil)
	assert.True(t, Is(err), "the last error is returned: %v", err)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.GreaterOrEqual(t, calls, 2)
}

// A starting kube-apiserver answers 503 with Retry-After: 5. Through
// WithoutRetryAfter the answer comes back at once, as an error Retry
// retries at its own pace, where client-go alone would sleep 5 s and ask
// again. A 429's Retry-After is the server's flow control and stays.
func TestA503ComesBackAtOnceAndA429IsWaitedFor(t *testing.T) {
	for _, tc := range []struct {
		code     int
		requests int32
	}{{http.StatusServiceUnavailable, 1}, {http.StatusTooManyRequests, 2}} {
		var requests atomic.Int32
		server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if requests.Add(1) > 1 {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`))
				return
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, "not ready", tc.code)
		}))
		config := &rest.Config{Host: server.URL, WrapTransport: WithoutRetryAfter}
		client, err := rest.UnversionedRESTClientFor(withCodecs(config))
		require.NoError(t, err)
		began := time.Now()
		err = client.Get().AbsPath("/api").Do(context.Background()).Error()
		took := time.Since(began)
		server.Close()
		assert.Equal(t, tc.requests, requests.Load(), "%d: requests", tc.code)
		if tc.code == http.StatusServiceUnavailable {
			assert.True(t, Is(err), "a 503 is no server: %v", err)
			assert.Less(t, took, 500*time.Millisecond, "the 503's Retry-After is not waited out")
		} else {
			assert.NoError(t, err)
			assert.GreaterOrEqual(t, took, time.Second, "a 429's Retry-After is waited out")
		}
	}
}

func withCodecs(c *rest.Config) *rest.Config {
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	c.GroupVersion = &schema.GroupVersion{Version: "v1"}
	return c
}
