package inferencepoolexportsummary

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestReaderMember(t *testing.T) {
	for _, tc := range []struct {
		name     string
		user     user.Info
		want     string
		identity bool
	}{
		{name: "a group names the member", user: &user.DefaultInfo{Name: "mci-member-reader", Groups: []string{"system:authenticated", "mci.x-k8s.io:member:cluster-b"}}, want: "cluster-b", identity: true},
		{name: "a ServiceAccount names the member", user: &user.DefaultInfo{Name: "system:serviceaccount:mci-system:mci-member-reader.cluster-c"}, want: "cluster-c", identity: true},
		{name: "the shared reader names no member", user: &user.DefaultInfo{Name: "system:serviceaccount:mci-system:mci-member-reader"}},
		{name: "a person names no member", user: &user.DefaultInfo{Name: "alice", Groups: []string{"system:masters"}}},
		{name: "two members named is no member", user: &user.DefaultInfo{Name: "system:serviceaccount:mci-system:mci-member-reader.cluster-c", Groups: []string{"mci.x-k8s.io:member:cluster-b"}}},
		{name: "the same member named twice is that member", user: &user.DefaultInfo{Name: "system:serviceaccount:mci-system:mci-member-reader.cluster-b", Groups: []string{"mci.x-k8s.io:member:cluster-b"}}, want: "cluster-b", identity: true},
		{name: "a name that cannot be a member's is no member", user: &user.DefaultInfo{Groups: []string{"mci.x-k8s.io:member:Cluster B"}}},
		{name: "no user is no member"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ReaderMember(tc.user)
			assert.Equal(t, tc.identity, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

type labelsOf map[string]map[string]string

func (l labelsOf) MemberLabels(name string) map[string]string { return l[name] }

// The summary stream sends a reader the exports whose scope includes the
// member it reads for, and a reader that is no member the unscoped ones.
func TestSummariesAreSentToTheMembersInTheirScope(t *testing.T) {
	summary := func(exportTo string) *inference.InferencePoolExportSummary {
		s := &inference.InferencePoolExportSummary{}
		if exportTo != "" {
			s.Annotations = map[string]string{v1alpha1.ExportToAnnotation: exportTo}
		}
		return s
	}
	visible := Visibility(labelsOf{"cluster-b": {"region": "eu"}, "cluster-c": {"region": "us"}})
	reader := func(u user.Info) func(*inference.InferencePoolExportSummary) bool {
		ctx := context.Background()
		if u != nil {
			ctx = genericapirequest.WithUser(ctx, u)
		}
		f := visible(ctx)
		return func(s *inference.InferencePoolExportSummary) bool { return f(s) }
	}
	b := reader(&user.DefaultInfo{Name: "r", Groups: []string{MemberGroupPrefix + "cluster-b"}})
	c := reader(&user.DefaultInfo{Name: "system:serviceaccount:mci-system:" + MemberServiceAccountPrefix + "cluster-c"})
	nobody := reader(&user.DefaultInfo{Name: "alice"})

	for _, tc := range []struct {
		name         string
		exportTo     string
		b, c, nobody bool
	}{
		{name: "an export to the whole ClusterSet reaches every reader", b: true, c: true, nobody: true},
		{name: "an export to cluster-b reaches cluster-b only", exportTo: `{"clusters":["cluster-b"]}`, b: true},
		{name: "an export to region us reaches cluster-c only", exportTo: `{"selector":"region=us"}`, c: true},
		{name: "a selector of absent labels reaches no reader that is no member", exportTo: `{"selector":"!zone"}`, b: true, c: true},
		{name: "a scope that does not parse reaches nobody", exportTo: `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := summary(tc.exportTo)
			assert.Equal(t, tc.b, b(s), "cluster-b")
			assert.Equal(t, tc.c, c(s), "cluster-c")
			assert.Equal(t, tc.nobody, nobody(s), "a reader that is no member")
		})
	}
}

// A watch judges each summary with the reader's labels as this cluster
// knows them then: a reader whose watch began before its labels were
// known (this server still reading its membership) is sent the next
// summary its labels select.
func TestAWatchJudgesSummariesWithTheLabelsKnownThen(t *testing.T) {
	known := labelsOf{}
	visible := Visibility(known)
	ctx := genericapirequest.WithUser(context.Background(), &user.DefaultInfo{Name: "r", Groups: []string{MemberGroupPrefix + "cluster-b"}})
	watch := visible(ctx)
	s := &inference.InferencePoolExportSummary{}
	s.Annotations = map[string]string{v1alpha1.ExportToAnnotation: `{"selector":"region=eu"}`}
	assert.False(t, watch(s), "no labels known yet")
	known["cluster-b"] = map[string]string{"region": "eu"}
	assert.True(t, watch(s), "the labels known once the membership was read")
}

// A reader that names no member is counted on every request, by reason,
// and logged once per change of who it is.
func TestUnidentifiedReadersAreCountedAndLoggedOncePerChange(t *testing.T) {
	var logged bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logged))))
	visible := Visibility(labelsOf{})
	before := map[string]float64{}
	for _, r := range []string{unidentifiedNoMember, unidentifiedTwoMembers, unidentifiedInvalidName} {
		before[r] = counter(t, r)
	}
	alice := &user.DefaultInfo{Name: "alice"}
	two := &user.DefaultInfo{Name: "system:serviceaccount:mci-system:mci-member-reader.cluster-c", Groups: []string{"mci.x-k8s.io:member:cluster-b"}}
	member := &user.DefaultInfo{Groups: []string{"mci.x-k8s.io:member:cluster-b"}}
	for _, u := range []user.Info{alice, alice, alice, member, two, two, alice} {
		visible(genericapirequest.WithUser(ctx, u))
	}
	assert.Equal(t, 4.0, counter(t, unidentifiedNoMember)-before[unidentifiedNoMember], "every request of alice")
	assert.Equal(t, 2.0, counter(t, unidentifiedTwoMembers)-before[unidentifiedTwoMembers])
	assert.Equal(t, 0.0, counter(t, unidentifiedInvalidName)-before[unidentifiedInvalidName])
	assert.Equal(t, 3, strings.Count(logged.String(), "names no member of the ClusterSet"), "alice, the two-member reader, alice again: %s", logged.String())
}

func counter(t *testing.T, reason string) float64 {
	t.Helper()
	v, err := testutil.GetCounterMetricValue(unidentifiedReaders.WithLabelValues(reason))
	require.NoError(t, err)
	return v
}
