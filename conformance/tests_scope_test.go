package conformance

import (
	"context"
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemberLabelsAreGivenOnceAMember(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--member-labels=cluster-b:region=eu,tier=gold", "--member-labels=cluster-c:"}))
	assert.Equal(t, map[string]map[string]string{"cluster-b": {"region": "eu", "tier": "gold"}, "cluster-c": {}}, c.MemberLabels)

	for _, bad := range [][]string{
		{"--member-labels=region=eu"},
		{"--member-labels=:region=eu"},
		{"--member-labels=cluster-b:region=e u"},
		{"--member-labels=cluster-b:region=eu", "--member-labels=cluster-b:tier=gold"},
	} {
		var c Config
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.AddFlags(fs)
		assert.Error(t, fs.Parse(bad), "%v", bad)
	}
}

// The selector splits the members other than the exporter: some have the
// label, some do not; without such a label there is no test.
func TestTheSelectorSplitsTheImporters(t *testing.T) {
	cs := []*Cluster{{Name: "b"}, {Name: "c"}}
	key, value, ok := splittingLabel(map[string]map[string]string{"b": {"env": "prod", "region": "eu"}, "c": {"env": "prod", "region": "us"}}, cs)
	assert.True(t, ok)
	assert.Equal(t, "region=eu", key+"="+value, "env is had by both: it splits nothing")

	key, value, ok = splittingLabel(map[string]map[string]string{"b": {}, "c": {"region": "us"}}, cs)
	assert.True(t, ok)
	assert.Equal(t, "region=us", key+"="+value, "a member without the key is outside")

	_, _, ok = splittingLabel(map[string]map[string]string{"b": {"region": "eu"}, "c": {"region": "eu"}}, cs)
	assert.False(t, ok)
}

func TestScopingBySelectorIsSkippedUnlessEveryMemberHasLabelsGiven(t *testing.T) {
	three := []*Cluster{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	for _, tc := range []struct {
		labels map[string]map[string]string
		reason string
	}{
		{nil, "no --member-labels"},
		{map[string]map[string]string{"a": {}, "b": {"region": "eu"}}, "--member-labels names no labels for c"},
		{map[string]map[string]string{"a": {}, "b": {"region": "eu"}, "c": {"region": "eu"}}, "no label of --member-labels is had by some of b, c"},
	} {
		s := offlineSuite()
		s.clusters = three
		s.cfg.MemberLabels = tc.labels
		res := s.RunTest(context.Background(), Test{Name: "x", Label: Optional, Clusters: 3, Run: testScopeBySelector})
		assert.Equal(t, Skip, res.Outcome)
		assert.Contains(t, res.Reason, tc.reason)
	}
}
