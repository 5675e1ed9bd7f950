// Package waitfor is how the tests wait: Eventually polls a condition
// until it holds (instead of sleeping and hoping the system got there),
// Consistently polls it for a window and fails the first time it does not
// hold (instead of sleeping and then looking once, which proves an absence
// only at that one instant). Both are apimachinery's wait polls.
package waitfor

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval is how often a condition is polled.
const Interval = 100 * time.Millisecond

// Condition reports whether the state the test waits for holds and, when
// it does not, what the state is (the failure message).
type Condition func(ctx context.Context) (ok bool, state string)

// Eventually polls cond (first at once, then every Interval) until it
// holds, and fails the test with cond's last state when it has not held
// within timeout or ctx ends first.
func Eventually(t testing.TB, ctx context.Context, timeout time.Duration, cond Condition) {
	t.Helper()
	EventuallyEvery(t, ctx, Interval, timeout, cond)
}

// EventuallyEvery is Eventually polling every interval: for a test that
// measures how soon the condition holds, to that resolution.
func EventuallyEvery(t testing.TB, ctx context.Context, interval, timeout time.Duration, cond Condition) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(ctx context.Context) (bool, error) {
		ok, state := cond(ctx)
		last = state
		return ok, nil
	})
	if err != nil {
		t.Fatalf("condition never held within %s (%v); last state: %s", timeout, err, last)
	}
}

// Consistently polls cond (first at once, then every Interval) for
// window and fails the test with cond's state the first time it does not
// hold, or when ctx ends before the window does. cond is given ctx, not a
// context that ends with the window, so that a call in flight at the end
// of the window is not cut short and taken for a failure.
func Consistently(t testing.TB, ctx context.Context, window time.Duration, cond Condition) {
	t.Helper()
	var broken bool
	var state string
	err := wait.PollUntilContextTimeout(ctx, Interval, window, true, func(context.Context) (bool, error) {
		ok, s := cond(ctx)
		broken, state = !ok, s
		return broken, nil
	})
	switch {
	case broken:
		t.Fatalf("condition stopped holding within %s: %s", window, state)
	case ctx.Err() != nil:
		t.Fatalf("the context ended before the %s window did: %v", window, ctx.Err())
	case err != nil && !wait.Interrupted(err):
		t.Fatalf("polling the condition: %v", err)
	}
}
