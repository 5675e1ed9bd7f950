package clusterset

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/pkg/versionvector"
)

func TestOnlyAKubeAPIServersResourceVersionsAreOrdered(t *testing.T) {
	for _, tc := range []struct {
		name string
		rv   string
		want uint64
		ok   bool
	}{
		{name: "an etcd revision", rv: "12345", want: 12345, ok: true},
		{name: "the largest int64", rv: strconv.FormatInt(math.MaxInt64, 10), want: math.MaxInt64, ok: true},
		{name: "past the int64 range", rv: strconv.FormatUint(math.MaxInt64+1, 10)},
		{name: "past the uint64 range", rv: "18446744073709551616"},
		{name: "zero", rv: "0"},
		{name: "empty", rv: ""},
		{name: "not a number", rv: "not-a-version"},
		{name: "negative", rv: "-5"},
		{name: "with a sign", rv: "+5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := memberResourceVersion(tc.rv)
			if !tc.ok {
				assert.Error(t, err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestAMemberSendingAResourceVersionNoKubeAPIServerIssuesIsFrozenOnce(t *testing.T) {
	events := 0
	m := &member{name: "cluster-b", quota: newQuota(Limits{}), handler: func(Event) { events++ }}
	_, ok := m.resourceVersion("not-a-version")
	assert.False(t, ok, "the change is not passed on")
	reason, _, message := m.quota.state()
	assert.Equal(t, quotaResourceVersion, reason)
	assert.Contains(t, message, "not-a-version")
	_, ok = m.resourceVersion("18446744073709551615")
	assert.False(t, ok)
	assert.Equal(t, uint64(1), m.quota.exceededCount(quotaResourceVersion), "frozen once")
	assert.Equal(t, 1, events, "its imports are told once")

	local := &member{name: "local", handler: func(Event) {}}
	rv, ok := local.resourceVersion("not-a-version")
	assert.True(t, ok, "the local cluster is trusted")
	assert.Zero(t, rv, "read as unknown")
}

func TestASummaryWithAPlainOrAnOutOfRangeMemberComponent(t *testing.T) {
	m := &member{name: "cluster-b", quota: newQuota(Limits{}), handler: func(Event) {}}
	rv, ok := m.summaryRV("261")
	assert.True(t, ok, "a plain resourceVersion, as summaries served from CRDs carry, is the member's")
	assert.Equal(t, uint64(261), rv)
	_, ok = m.summaryRV(versionvector.Encode(map[string]uint64{"cluster-b": math.MaxUint64}))
	assert.False(t, ok)
	reason, _, _ := m.quota.state()
	assert.Equal(t, quotaResourceVersion, reason)
}
