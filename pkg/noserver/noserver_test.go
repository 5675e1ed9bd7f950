package noserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
