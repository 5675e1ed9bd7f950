package clusterset

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestAHeldGateMakesRequestsWaitUntilReleasedOrCancelled(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(srv.Close)
	g := newLinkGate()
	client := &http.Client{Transport: g.wrap(http.DefaultTransport)}
	get := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}

	require.NoError(t, get(t.Context()), "an open gate lets requests go")

	g.hold()
	assert.True(t, g.held())
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, get(ctx), context.DeadlineExceeded, "a held request ends with its context")

	done := make(chan error, 1)
	go func() { done <- get(t.Context()) }()
	select {
	case err := <-done:
		t.Fatalf("a request went through a held gate: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	g.release()
	select {
	case err := <-done:
		require.NoError(t, err, "a waiting request goes once the gate is released")
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting request did not go after release")
	}
	assert.False(t, g.held())
}

func TestAPendingProbeFlagsAMemberThatHasNotAnsweredForTheThreshold(t *testing.T) {
	th := thresholds{unreachableAfter: 5 * time.Second}
	t0 := time.Now()
	m := &member{name: "cluster-a", reachability: reachability{lastAnswered: t0}}

	assert.Equal(t, 5*time.Second, m.untilThreshold(t0, th), "counted from the last answer")
	assert.False(t, m.crossThresholds(t0.Add(4*time.Second), th), "a slow answer within the threshold is no outage")
	assert.Nil(t, m.status())
	assert.True(t, m.crossThresholds(t0.Add(5*time.Second), th), "no answer for the threshold: unreachable, probe pending or not")
	require.NotNil(t, m.status())
	assert.Equal(t, t0, m.status().Since, "failing since its last answer")
	assert.Equal(t, 10*time.Second, probeTimeoutFor(thresholds{unreachableAfter: 10 * time.Second}), "a probe may take as long as the threshold")
	assert.Equal(t, probeTimeout, probeTimeoutFor(thresholds{unreachableAfter: time.Second}))
}

func TestEveryThresholdHoldsSeveralProbes(t *testing.T) {
	// A pending probe counts from the member's last answer, so a probe
	// sent a whole threshold after it would flag a member that answers.
	for _, tc := range []struct {
		unreachableAfter, want time.Duration
	}{
		{unreachableAfter: 10 * time.Second, want: probeInterval},
		{unreachableAfter: 4 * time.Second, want: probeInterval},
		{unreachableAfter: time.Second, want: 250 * time.Millisecond},
		{unreachableAfter: 0, want: probeInterval},
	} {
		assert.Equal(t, tc.want, probeIntervalFor(thresholds{unreachableAfter: tc.unreachableAfter}), "threshold %s", tc.unreachableAfter)
	}
}

func TestOnlyAProbeAnsweredReadyAndAcceptedOpensTheGate(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "ready", want: true},
		{name: "not ready (a kube-apiserver starting: 500)", err: apierrors.NewInternalError(errors.New("poststarthook/apiservice-registration-controller failed"))},
		{name: "credentials refused (401)", err: apierrors.NewUnauthorized("token expired")},
		{name: "credentials refused (403: no role binding, or an authorizer still starting)", err: fmt.Errorf("probe: %w", apierrors.NewForbidden(schema.GroupResource{}, "readyz", errors.New("no")))},
		{name: "a refused connection", err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")},
		{name: "no answer within the timeout", err: context.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, gateOpens(tc.err))
		})
	}
}
