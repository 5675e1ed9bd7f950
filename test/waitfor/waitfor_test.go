package waitfor

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// recorder is a testing.TB that records a Fatalf instead of ending the
// test, so the helpers' failures can be checked.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var polls atomic.Int32
	r := &recorder{TB: t}
	start := time.Now()
	Eventually(r, t.Context(), 5*time.Second, func(context.Context) (bool, string) {
		return polls.Add(1) == 3, "not yet"
	})
	assert.Empty(t, r.failed)
	assert.Equal(t, int32(3), polls.Load())
	assert.Less(t, time.Since(start), 2*time.Second, "it polls every Interval, not the whole timeout")
}

func TestEventuallyFailsWithTheLastState(t *testing.T) {
	r := &recorder{TB: t}
	var n int
	Eventually(r, t.Context(), 300*time.Millisecond, func(context.Context) (bool, string) {
		n++
		return false, fmt.Sprintf("state %d", n)
	})
	assert.Contains(t, r.failed, fmt.Sprintf("last state: state %d", n))
}

func TestConsistentlyHoldsForTheWholeWindow(t *testing.T) {
	r := &recorder{TB: t}
	var polls int
	start := time.Now()
	Consistently(r, t.Context(), 500*time.Millisecond, func(context.Context) (bool, string) {
		polls++
		return true, ""
	})
	assert.Empty(t, r.failed)
	assert.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
	assert.GreaterOrEqual(t, polls, 4, "polled through the window")
}

func TestConsistentlyFailsAtTheFirstBreak(t *testing.T) {
	r := &recorder{TB: t}
	var polls int
	Consistently(r, t.Context(), 5*time.Second, func(context.Context) (bool, string) {
		polls++
		return polls < 3, "a write happened"
	})
	assert.True(t, strings.HasSuffix(r.failed, "a write happened"), r.failed)
	assert.Equal(t, 3, polls)
}

func TestConsistentlyGivesTheConditionTheCallersContext(t *testing.T) {
	r := &recorder{TB: t}
	Consistently(r, t.Context(), 300*time.Millisecond, func(ctx context.Context) (bool, string) {
		// A call in flight as the window closes is not cut short.
		time.Sleep(150 * time.Millisecond)
		return ctx.Err() == nil, fmt.Sprintf("context ended: %v", ctx.Err())
	})
	assert.Empty(t, r.failed)
}

func TestConsistentlyFailsWhenTheContextEndsFirst(t *testing.T) {
	r := &recorder{TB: t}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	Consistently(r, ctx, 5*time.Second, func(context.Context) (bool, string) { return true, "" })
	assert.Contains(t, r.failed, "context ended before")
}
