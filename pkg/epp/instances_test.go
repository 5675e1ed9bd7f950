package epp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/discovery"
)

// TestInstanceSetMetadata drives one instance's /metadata through the
// answers a model server can give, one recomputation per step: what the
// instance counts as, and the models it is a candidate for.
func TestInstanceSetMetadata(t *testing.T) {
	served := func(base string, adapters ...any) fetchAnswer {
		return fetchAnswer{md: map[string]any{"Model": map[string]any{"name": base, "lora_adapters": adapters}}}
	}
	noMetadata := fetchAnswer{err: fmt.Errorf("GET answered 404: %w", discovery.ErrNoMetadata)}
	unreachable := fetchAnswer{err: errors.New("connection refused")}
	invalid := fetchAnswer{md: map[string]any{"Model": "llama"}}

	type step struct {
		answer    fetchAnswer
		state     string
		models    []string // nil: any model
		candidate bool
		failed    bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "metadata naming models makes a candidate for them", steps: []step{
			{answer: served("llama", "lora-b", "lora-a"), state: MetadataServed, models: []string{"llama", "lora-a", "lora-b"}, candidate: true},
		}},
		{name: "no /metadata makes a candidate for any model", steps: []step{
			{answer: noMetadata, state: MetadataAbsent, candidate: true},
		}},
		{name: "metadata naming no model makes a candidate for any model", steps: []step{
			{answer: fetchAnswer{md: map[string]any{"Transport": map[string]any{}}}, state: MetadataAbsent, candidate: true},
		}},
		{name: "a first fetch that fails makes no candidate until one succeeds", steps: []step{
			{answer: unreachable, state: MetadataUnreachable, failed: true},
			{answer: served("llama"), state: MetadataServed, models: []string{"llama"}, candidate: true},
		}},
		{name: "a failed fetch keeps the last valid metadata", steps: []step{
			{answer: served("llama"), state: MetadataServed, models: []string{"llama"}, candidate: true},
			{answer: unreachable, state: MetadataStale, models: []string{"llama"}, candidate: true, failed: true},
			{answer: served("qwen"), state: MetadataServed, models: []string{"qwen"}, candidate: true},
		}},
		{name: "invalid metadata makes no candidate, and drops what was valid", steps: []step{
			{answer: served("llama"), state: MetadataServed, models: []string{"llama"}, candidate: true},
			{answer: invalid, state: MetadataInvalid, failed: true},
			{answer: noMetadata, state: MetadataAbsent, candidate: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var answer fetchAnswer
			set := newInstanceSet(time.Nanosecond, nil)
			set.fetch = func(context.Context, *http.Client, string) (map[string]any, error) { return answer.md, answer.err }
			inst := discovery.Instance{ID: "pod-a", Namespace: "ns", Address: "192.0.2.1"}
			set.apply([]discovery.Event{{Type: discovery.InstanceAdded, Instance: inst}})
			for i, st := range tt.steps {
				answer = st.answer
				err := set.refreshMetadata(t.Context(), 8000)
				assert.Equal(t, st.failed, err != nil, "step %d: %v", i, err)
				assert.Equal(t, st.state, set.instances["pod-a"].state, "step %d", i)
				eps := set.endpoints(8000)
				if !st.candidate {
					assert.Empty(t, eps, "step %d", i)
					continue
				}
				require.Len(t, eps, 1, "step %d", i)
				assert.Equal(t, "192.0.2.1:8000", eps[0].Address)
				assert.Equal(t, st.models, eps[0].Models, "step %d", i)
				assert.Equal(t, 1.0, testutil.ToFloat64(set.gauge.WithLabelValues(st.state)), "step %d", i)
			}
		})
	}
}

type fetchAnswer struct {
	md  map[string]any
	err error
}

func TestInstanceSetFetchesWhenDue(t *testing.T) {
	now := time.Unix(1000, 0)
	var urls []string
	set := newInstanceSet(time.Minute, nil)
	set.now = func() time.Time { return now }
	set.fetch = func(_ context.Context, _ *http.Client, url string) (map[string]any, error) {
		urls = append(urls, url)
		return map[string]any{"model": map[string]any{"name": "llama"}}, nil
	}
	a := discovery.Instance{ID: "pod-a", Address: "192.0.2.1"}
	set.apply([]discovery.Event{{Type: discovery.InstanceAdded, Instance: a}})
	require.NoError(t, set.refreshMetadata(t.Context(), 8000))
	assert.Equal(t, []string{"http://192.0.2.1:8000"}, urls, "a new instance is fetched")

	now = now.Add(30 * time.Second)
	require.NoError(t, set.refreshMetadata(t.Context(), 8000))
	assert.Len(t, urls, 1, "not again before the refresh interval")

	require.NoError(t, set.refreshMetadata(t.Context(), 9000))
	assert.Equal(t, "http://192.0.2.1:9000", urls[len(urls)-1], "a new port is fetched at once")

	now = now.Add(time.Minute)
	require.NoError(t, set.refreshMetadata(t.Context(), 9000))
	assert.Len(t, urls, 3, "again after the refresh interval")

	set.apply([]discovery.Event{{Type: discovery.InstanceRemoved, Instance: a}})
	require.NoError(t, set.refreshMetadata(t.Context(), 9000))
	assert.Len(t, urls, 3, "a removed instance is not fetched")
	assert.Empty(t, set.endpoints(9000))
}
