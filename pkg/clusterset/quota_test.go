package clusterset

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/component-base/metrics/testutil"

	"github.com/mci-dev/mci/pkg/imports"
)

func TestAMemberPastALimitIsFrozenAtTheFirstOneItExceeds(t *testing.T) {
	limits := Limits{Objects: 3, Bytes: 100, Namespaces: 2, EventsPerSecond: 0.001, EventBurst: 2}
	for _, tc := range []struct {
		name string
		send func(q *quota) (string, string)
		want string
	}{
		{name: "within every limit", send: func(q *quota) (string, string) {
			q.object(KindInferencePool, "", "a", 10, false)
			q.object(KindInferencePool, "", "a", 20, true)
			return q.object(KindInferencePool, "", "b", 10, true)
		}},
		{name: "one object too many", want: quotaObjects, send: func(q *quota) (string, string) {
			for i := range 3 {
				q.object(KindInferencePool, "", fmt.Sprint(i), 1, false)
			}
			return q.object(KindInferencePool, "", "3", 1, false)
		}},
		{name: "a deleted object makes room", send: func(q *quota) (string, string) {
			for i := range 3 {
				q.object(KindInferencePool, "", fmt.Sprint(i), 1, false)
			}
			q.object(KindInferencePool, "", "0", 0, true)
			return q.object(KindInferencePool, "", "3", 1, false)
		}},
		{name: "an object that grows past the bytes", want: quotaBytes, send: func(q *quota) (string, string) {
			q.object(KindInferencePool, "", "a", 50, false)
			return q.object(KindInferencePool, "", "a", 101, false)
		}},
		{name: "changes faster than the rate, past the burst", want: quotaEventRate, send: func(q *quota) (string, string) {
			q.object(KindInferencePool, "", "a", 1, true)
			q.object(KindInferencePool, "", "a", 1, true)
			return q.object(KindInferencePool, "", "a", 1, true)
		}},
		{name: "a relist's unchanged objects do not count as changes", send: func(q *quota) (string, string) {
			for range 10 {
				q.object(KindInferencePool, "", "a", 1, false)
			}
			return "", ""
		}},
		{name: "a list that would hold too many objects with the other kinds", want: quotaObjects, send: func(q *quota) (string, string) {
			q.object(KindNamespace, "", "a", 1, false)
			q.object(KindNamespace, "", "b", 1, false)
			return q.listing(KindInferencePool, "", listCount{objects: 2, bytes: 2})
		}},
		{name: "a relist replaces what it held of its kind", send: func(q *quota) (string, string) {
			q.object(KindNamespace, "", "a", 1, false)
			q.object(KindInferencePool, "", "a", 1, false)
			q.object(KindInferencePool, "", "b", 1, false)
			return q.listing(KindInferencePool, "", listCount{objects: 2, bytes: 2})
		}},
		{name: "a list of one namespace with what the others hold", want: quotaObjects, send: func(q *quota) (string, string) {
			q.object(KindService, "a", "s1", 1, false)
			q.object(KindService, "a", "s2", 1, false)
			return q.listing(KindService, "b", listCount{objects: 2, bytes: 2})
		}},
		{name: "a relist of one namespace replaces what it held there", send: func(q *quota) (string, string) {
			q.object(KindService, "a", "s1", 1, false)
			q.object(KindService, "b", "s1", 1, false)
			q.object(KindService, "b", "s2", 1, false)
			return q.listing(KindService, "b", listCount{objects: 2, bytes: 2})
		}},
		{name: "a list past the bytes", want: quotaBytes, send: func(q *quota) (string, string) {
			q.object(KindNamespace, "", "a", 50, false)
			return q.listing(KindInferencePool, "", listCount{objects: 1, bytes: 51})
		}},
		{name: "too many namespaces", want: quotaNamespaces, send: func(q *quota) (string, string) {
			return q.namespaceCount(3)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, msg := tc.send(newQuota(limits))
			assert.Equal(t, tc.want, reason)
			if tc.want != "" {
				assert.Contains(t, msg, "--member-max-")
			}
		})
	}
}

func TestAFrozenMemberStopsReadingAndIsFlaggedOnce(t *testing.T) {
	var events []Event
	m := &member{name: "cluster-b", quota: newQuota(Limits{Objects: 1, FreezeRetry: time.Minute}), handler: func(ev Event) { events = append(events, ev) }}
	stopped := 0
	m.quota.onFreeze(func() { stopped++ })

	assert.True(t, m.admit(KindInferencePool, "ns", "a", &compactSummary{data: "x", size: 1}, false, false))
	assert.False(t, m.admit(KindInferencePool, "ns", "b", &compactSummary{data: "x", size: 1}, false, false), "the object past the limit is not passed on")
	assert.False(t, m.admit(KindInferencePool, "ns", "a", nil, true, true), "nothing is passed on once frozen")
	m.freeze(quotaBytes, "again")

	assert.Equal(t, 1, stopped, "the informers are stopped once")
	assert.Equal(t, []Event{{Member: "cluster-b", Kind: KindMember}}, events, "one member event: its imports say it is frozen")
	assert.NoError(t, m.readyErr(), "a frozen member does not hold readiness")
	v := m.view()
	require.NotNil(t, v.Unreachable, "flagged as importers show an unreachable member")
	assert.Contains(t, v.Unreachable.Message, "frozen since")
	assert.Contains(t, v.Unreachable.Message, "more than 1 objects (--member-max-objects)")

	u := m.frozenFlag(&imports.Unreachable{Since: time.Unix(1, 0), Message: "connection refused"})
	assert.Equal(t, time.Unix(1, 0), u.Since)
	assert.True(t, strings.HasPrefix(u.Message, "connection refused; frozen since"), u.Message)

	stoppedLate := false
	m.quota.onFreeze(func() { stoppedLate = true })
	assert.True(t, stoppedLate, "informers started after the member froze (at its discovery) stop at once")
}

func TestTheFrozenMetricsNameTheLimit(t *testing.T) {
	m := &member{name: "cluster-b", quota: newQuota(Limits{Objects: 1}), handler: func(Event) {}}
	m.freeze(quotaIdentity, "it publishes a cluster summary named \"cluster-c\", not after the member")
	c := New(Options{}, func(Event) {})
	c.members["cluster-b"] = m
	c.resort()
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(c), strings.NewReader(`
# HELP mci_clusterset_member_frozen [ALPHA] 1 while the member is frozen because it exceeded the limit named by quota (objects, bytes, namespaces, eventRate, responseBytes, identity, resourceVersion): its last known data is served flagged ClusterUnreachable and nothing more it sends is applied; else 0.
# TYPE mci_clusterset_member_frozen gauge
mci_clusterset_member_frozen{member="cluster-b",quota="bytes"} 0
mci_clusterset_member_frozen{member="cluster-b",quota="eventRate"} 0
mci_clusterset_member_frozen{member="cluster-b",quota="identity"} 1
mci_clusterset_member_frozen{member="cluster-b",quota="namespaces"} 0
mci_clusterset_member_frozen{member="cluster-b",quota="objects"} 0
mci_clusterset_member_frozen{member="cluster-b",quota="resourceVersion"} 0
mci_clusterset_member_frozen{member="cluster-b",quota="responseBytes"} 0
`), "mci_clusterset_member_frozen"))
}

func TestResponsesFromAMemberAreBounded(t *testing.T) {
	const limit = 1000
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := 10 * limit
		if r.URL.Query().Get("small") == "true" {
			n = limit
		}
		if r.URL.Query().Get("length") == "true" {
			w.Header().Set("Content-Length", fmt.Sprint(n))
		} else {
			w.Header().Set("Transfer-Encoding", "chunked")
		}
		_, _ = w.Write([]byte(strings.Repeat("x", n)))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name, query string
		wantErr     bool
		wantFrozen  bool
	}{
		{name: "a list within the limit is read whole", query: "small=true"},
		{name: "a list over the limit fails and freezes the member", query: "", wantErr: true, wantFrozen: true},
		{name: "a response whose length says it is over the limit is refused unread", query: "length=true", wantErr: true, wantFrozen: true},
		{name: "a watch that streamed the initial list is only ended too: it goes on as an ordinary watch", query: "watch=true&sendInitialEvents=true", wantErr: true},
		{name: "a watch that carried the limit is only ended, to be resumed", query: "watch=true", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tooLarge []error
			client := &http.Client{Transport: boundResponses(limit, func(err error) { tooLarge = append(tooLarge, err) })(http.DefaultTransport)}
			resp, err := client.Get(srv.URL + "/apis/x?" + tc.query)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "--member-max-response-bytes")
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, tc.wantFrozen, len(tooLarge) == 1, "%v", tooLarge)
		})
	}
}
