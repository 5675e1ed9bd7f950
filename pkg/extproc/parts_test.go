package extproc

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParts(t *testing.T) {
	boom := errors.New("boom")
	// untilStopped is a part that runs until the parts stop, then fails as
	// a server does when it is shut down.
	untilStopped := func(ctx context.Context) error {
		<-ctx.Done()
		return errors.New("closed")
	}
	tests := []struct {
		name    string
		what    string
		fail    bool // the second part fails at once
		cancel  bool // the caller's context ends
		wantErr string
	}{
		{name: "the first failure stops the others and is named by its part", what: "scraper", fail: true, wantErr: "scraper: boom"},
		{name: "an error that names its part already is returned as it is", fail: true, wantErr: "boom"},
		{name: "the caller's context ending stops every part without an error", what: "scraper", cancel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			parts, _ := NewParts(ctx)
			parts.Run("server", untilStopped)
			if tt.fail {
				parts.Run(tt.what, func(context.Context) error { return boom })
			}
			if tt.cancel {
				cancel()
			}
			err := parts.Wait()
			if tt.wantErr == "" {
				assert.NoError(t, err, "the stopped server's error is the stop's own")
				return
			}
			assert.EqualError(t, err, tt.wantErr)
			assert.ErrorIs(t, err, boom)
		})
	}
}
