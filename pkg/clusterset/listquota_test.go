package clusterset

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/labels"
)

// TestAMemberListingPastItsLimitsIsFrozenBeforeTheListIsHeld reads a
// member double serving more summaries than its objects limit (or bytes
// limit) allows, as a plain list in pages and as a streaming list
// (watch-list). It is frozen at that limit as it lists: of a paged list,
// at most one page past the limit is read; of either, nothing is applied,
// so the member holds nothing of the list that passed its limit.
func TestAMemberListingPastItsLimitsIsFrozenBeforeTheListIsHeld(t *testing.T) {
	const summaries = 100000
	objects := Limits{Objects: 1000, Bytes: 64 << 20, ResponseBytes: 64 << 20, FreezeRetry: time.Hour}
	bytes := Limits{Objects: 50000, Bytes: 1 << 20, ResponseBytes: 64 << 20, FreezeRetry: time.Hour}
	for _, tc := range []struct {
		name      string
		limits    Limits
		answers   hostileAnswers
		streaming bool
		want      string
	}{
		{name: "10^5 summaries in pages", limits: objects, answers: hostileAnswers{summaries: summaries}, want: quotaObjects},
		{name: "10^5 summaries as a streaming list", limits: objects, answers: hostileAnswers{summaries: summaries}, streaming: true, want: quotaObjects},
		{name: "summaries of 10 kB past the bytes in pages", limits: bytes, answers: hostileAnswers{summaries: 5000, summarySize: 10 << 10}, want: quotaBytes},
		{name: "summaries of 10 kB past the bytes as a streaming list", limits: bytes, answers: hostileAnswers{summaries: 5000, summarySize: 10 << 10}, streaming: true, want: quotaBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			answers := tc.answers
			answers.clusterName, answers.noStreamingList = "hostile", !tc.streaming
			config, double := startMemberDouble(t, answers)
			m, err := newMember("hostile", "test", config, tc.limits.ResponseBytes, func(Event) {})
			require.NoError(t, err)
			m.quota = newQuota(tc.limits)
			m.start(ctx, thresholds{unreachableAfter: time.Minute})
			defer m.stop()
			require.Equal(t, modeSummary, m.mode)

			require.Eventually(t, func() bool {
				reason, _, _ := m.quota.state()
				return reason != ""
			}, 30*time.Second, 10*time.Millisecond, "frozen")
			reason, _, message := m.quota.state()
			assert.Equal(t, tc.want, reason)
			assert.Contains(t, message, "--member-max-")
			if !tc.streaming {
				t.Logf("%d summaries listed of %d", double.listed.Load(), answers.summaries)
				// The limit is passed within the first page of the bytes
				// case, at the third page of the objects case.
				assert.LessOrEqual(t, double.listed.Load(), int64(min(answers.summaries, tc.limits.Objects+listPageSize)), "at most one page past the limit is read")
				if tc.want == quotaBytes {
					assert.LessOrEqual(t, double.listed.Load(), int64(listPageSize), "at most one page past the limit is read")
				}
			}
			held, err := m.summaries.List(labels.Everything())
			require.NoError(t, err)
			assert.Zero(t, len(held), "a list past the limit is not applied")
		})
	}
}
