package epptransport

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestFailedLogsOncePerChangeOfState(t *testing.T) {
	refused := status.Error(codes.Unavailable, "connection refused")
	reset := status.Error(codes.Unavailable, "connection reset by peer")
	eof := status.Error(codes.Unavailable, "EOF")
	timeout := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	tests := []struct {
		name string
		// steps are errors of Failed, nil for Reached.
		steps []error
		// wantLogged are the errors logged at level 0, in order.
		wantLogged []string
	}{
		{name: "the first failure is logged", steps: []error{refused}, wantLogged: []string{"connection refused"}},
		{name: "the same failure again is not", steps: []error{refused, refused, refused}, wantLogged: []string{"connection refused"}},
		{
			name:       "a reset link alternating its message is logged once",
			steps:      []error{reset, eof, reset, eof},
			wantLogged: []string{"connection reset by peer"},
		},
		{
			name:       "a change of the gRPC code is logged at once",
			steps:      []error{reset, timeout, timeout},
			wantLogged: []string{"connection reset by peer", "context deadline exceeded"},
		},
		{
			name:       "a failure after the address answered again is logged",
			steps:      []error{refused, nil, refused},
			wantLogged: []string{"connection refused", "connection refused"},
		},
		{name: "an error without a gRPC code is logged", steps: []error{errors.New("no Secret")}, wantLogged: []string{"no Secret"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logged []string
			logger := funcr.New(func(_, args string) {
				if strings.Contains(args, "EPP port unreachable") {
					logged = append(logged, args)
				}
			}, funcr.Options{Verbosity: 0})
			c := NewCredentials(nil, nil, logger)
			for _, err := range tt.steps {
				if err == nil {
					c.Reached("127.0.0.1:9002")
					continue
				}
				c.Failed("127.0.0.1:9002", err)
			}
			if assert.Len(t, logged, len(tt.wantLogged), "%q", logged) {
				for i, want := range tt.wantLogged {
					assert.Contains(t, logged[i], want)
				}
			}
		})
	}
}
