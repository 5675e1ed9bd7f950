package clusterset

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/labels"
)

// TestAMemberListingPastItsObjectsLimitIsFrozenBeforeTheListIsHeld reads a
// member double serving 10^5 summaries, more than its objects limit, as a
// plain list in pages and as a streaming list (watch-list). It is frozen
// at the objects limit as it lists: of a paged list, at most one page past
// the limit is read; of either, nothing is applied, so the member holds
// nothing of the list that passed its limit.
func TestAMemberListingPastItsObjectsLimitIsFrozenBeforeTheListIsHeld(t *testing.T) {
	const summaries = 100000
	limits := Limits{Objects: 1000, Bytes: 64 << 20, ResponseBytes: 64 << 20, FreezeRetry: time.Hour}
	for _, tc := range []struct {
		name      string
		streaming bool
	}{
		{name: "a list in pages", streaming: false},
		{name: "a streaming list", streaming: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			config, double := startMemberDouble(t, hostileAnswers{summaries: summaries, clusterName: "hostile", noStreamingList: !tc.streaming})
			m, err := newMember("hostile", "test", config, limits.ResponseBytes, func(Event) {})
			require.NoError(t, err)
			m.quota = newQuota(limits)
			m.start(ctx, thresholds{unreachableAfter: time.Minute})
			defer m.stop()
			require.Equal(t, modeSummary, m.mode)

			require.Eventually(t, func() bool {
				reason, _, _ := m.quota.state()
				return reason != ""
			}, 30*time.Second, 10*time.Millisecond, "frozen")
			reason, _, message := m.quota.state()
			assert.Equal(t, quotaObjects, reason)
			assert.Contains(t, message, "--member-max-objects")
			if !tc.streaming {
				t.Logf("%d summaries listed of %d, limit %d", double.listed.Load(), summaries, limits.Objects)
				assert.LessOrEqual(t, double.listed.Load(), int64(limits.Objects+listPageSize), "at most one page past the limit is read")
			}
			held, err := m.summaries.List(labels.Everything())
			require.NoError(t, err)
			assert.Zero(t, len(held), "a list past the limit is not applied")
		})
	}
}
