package clusterset

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
)

// TestASummaryWatchResumesAcrossTheMembersServerRestart reads a real
// member in summary mode: its kube-apiserver's aggregator in front of its
// own mci-apiserver. The member's mci-apiserver is stopped until this
// replica's summary watches meet the aggregator's 503, then started
// again. The watches resume from the resourceVersions they had: nothing of
// the member's summaries is listed again (no LIST, no streaming list), and
// the changes made since arrive as watch events. (A change made while the
// server is down is answered 410 by the restarted server, which has not
// seen it happen, and that still relists: see docs/membership.md.)
func TestASummaryWatchResumesAcrossTheMembersServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver, etcd and mci-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const member, ns = "restarting", "restart"
	cs, err := localclusterset.Up(ctx, localclusterset.Options{
		Dir: t.TempDir(), Clusters: []string{member}, MCIAPIServerBinary: mciAPIServerBinary(t), Log: testLog{t},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	config := cs.Clusters[0].Config
	_, err = kubernetes.NewForConfigOrDie(config).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pools := mciclient.NewForConfigOrDie(config).InferencePoolV1().InferencePools(ns)
	for _, name := range []string{"kept", "withdrawn"} {
		_, err := pools.Create(ctx, exportedPool(ns, name), metav1.CreateOptions{})
		require.NoError(t, err)
	}

	// This replica reads the member through its aggregator, as another
	// cluster's would (its cluster ID told apart), and counts what it asks
	// of the member's summaries.
	requests := &summaryRequests{ready: make(chan struct{})}
	remote := asAnotherCluster(config, "restarting-cluster-id")
	remote.Wrap(requests.wrap)
	var mu sync.Mutex
	events := map[string]int{}
	cache := New(Options{ClusterSetName: "test", LocalName: "importer", Local: config, UnreachableAfter: time.Minute, RemoveAfter: 2 * time.Minute}, func(ev Event) {
		if ev.Member == member && ev.Kind == KindExportSummary {
			mu.Lock()
			events[ev.Name]++
			mu.Unlock()
		}
	})
	go func() { _ = cache.Run(ctx, staticSource{member: {rest: remote, fingerprint: "1"}}) }()
	exported := func() []string {
		var names []string
		for _, s := range summariesOf(cache, member) {
			names = append(names, s.Name)
		}
		return names
	}
	require.Eventually(t, func() bool {
		m := cache.member(member)
		return m != nil && m.mode == modeSummary && m.hasSynced() && assert.ObjectsAreEqual([]string{"kept", "withdrawn"}, exported())
	}, 2*time.Minute, 50*time.Millisecond, "the member is read through its summaries")
	listed := requests.lists()
	t.Logf("before the restart: %d lists of the member's summaries (streaming lists included)", listed)

	require.NoError(t, cs.StopMCIAPIServer(member))
	require.Eventually(t, func() bool { return requests.unavailableWatches() > 0 }, time.Minute, 20*time.Millisecond,
		"a watch of the member's summaries meets the aggregator's 503")
	t.Logf("the aggregator answered a watch: %s", requests.unavailableText())
	// A server shutting down answers 503 with Retry-After: 1, which
	// client-go's request retries itself, up to 10 times, before the
	// watch returns the error that is counted.
	require.Eventually(t, func() bool { return cache.member(member).summaryStream.errorCount() > 0 }, 30*time.Second, 20*time.Millisecond,
		"the failed watch is counted (mci_clusterset_member_summary_errors_total)")
	require.NoError(t, cs.StartMCIAPIServer(ctx, member))
	requests.serverReady()
	// The Reflector's retry delay grows while the server is down, up to
	// 30 s with jitter up to twice that: on a loaded machine, where the
	// stop and start take long, the next retry can be a minute away.
	require.Eventually(t, requests.watchesBack, 2*time.Minute, 20*time.Millisecond,
		"every summary watch that met the 503 is open again")

	// Changes made once the server is back arrive on the resumed watches.
	_, err = pools.Patch(ctx, "withdrawn", types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+v1alpha1.ExportAnnotation+`":null}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	_, err = pools.Create(ctx, exportedPool(ns, "added"), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]string{"added", "kept"}, exported())
	}, time.Minute, 50*time.Millisecond, "the changes made after the member's server restarted arrive")
	mu.Lock()
	assert.Positive(t, events["withdrawn"], "the withdrawal arrives as an event")
	assert.Positive(t, events["added"], "the new export arrives as an event")
	mu.Unlock()

	requests.mu.Lock()
	defer requests.mu.Unlock()
	if !assert.Equal(t, listed, requests.listed, "nothing of the member's summaries is listed again") {
		t.Logf("requests:\n%s", strings.Join(requests.trace, "\n"))
	}
	for resource, rvs := range requests.resumed {
		require.NotEmpty(t, rvs, resource)
		for _, rv := range rvs {
			assert.Equal(t, requests.failedAt[resource], rv, "every watch of %s after the 503 resumes from the resourceVersion the failed one asked for", resource)
		}
	}
}

func exportedPool(ns, name string) *poolv1.InferencePool {
	return &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
}

// mciAPIServerBinary is the mci-apiserver of the harness's binaries
// ($MCI_BIN_DIR, else the repository's _output/bin), built into the test's
// directory when there is none.
func mciAPIServerBinary(t *testing.T) string {
	t.Helper()
	if dir, err := localclusterset.BinDir(); err == nil {
		if bin := filepath.Join(dir, "mci-apiserver"); fileExists(bin) {
			return bin
		}
	}
	bin := filepath.Join(t.TempDir(), "mci-apiserver")
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/mci-dev/mci/cmd/mci-apiserver").CombinedOutput()
	require.NoError(t, err, "building mci-apiserver: %s", out)
	return bin
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// summaryRequests records what a replica asks of a member's summaries.
type summaryRequests struct {
	mu sync.Mutex
	// listed counts lists: LISTs and streaming lists (watches with
	// sendInitialEvents).
	listed int
	// unavailable counts the watches answered 503, text the last answer.
	unavailable int
	text        string
	// ready is closed once the restarted server is ready. The harness's
	// aggregator reaches the server through an ExternalName Service, so
	// it sends requests to a server that has just started, before it
	// authenticates them (they are refused as system:anonymous); a
	// Service's endpoints, in a real cluster, take the server in once it
	// is ready. The requests that follow a 503 wait for it, as they would
	// there.
	ready chan struct{}
	// failedAt is the resourceVersion of each resource's first watch
	// answered 503; resumed are those of its watches started since, until
	// one is answered 200 (the last one).
	failedAt map[string]string
	resumed  map[string][]string
	back     map[string]bool
	trace    []string
}

func (s *summaryRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		path := r.URL.Path
		if r.Method != http.MethodGet || !strings.HasPrefix(path, "/apis/"+v1alpha1.SchemeGroupVersion.String()+"/") ||
			!(strings.HasSuffix(path, "/inferencepoolexportsummaries") || strings.HasSuffix(path, "/inferenceclustersummaries")) {
			return rt.RoundTrip(r)
		}
		resource := path[strings.LastIndex(path, "/")+1:]
		q := r.URL.Query()
		watching := q.Get("watch") == "true" || q.Get("watch") == "1"
		rv := q.Get("resourceVersion")
		s.mu.Lock()
		restarting := len(s.failedAt) > 0
		s.mu.Unlock()
		if restarting {
			select {
			case <-s.ready:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		}
		s.mu.Lock()
		if !watching || q.Get("sendInitialEvents") == "true" {
			s.listed++
		} else if _, failed := s.failedAt[resource]; failed && !s.back[resource] {
			s.resumed[resource] = append(s.resumed[resource], rv)
		}
		s.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		var text string
		if err == nil && watching && code != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			_ = resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			text = strings.TrimSpace(string(body))
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.trace = append(s.trace, fmt.Sprintf("%s %s?%s -> %d %v %s", time.Now().Format("15:04:05.000"), path, r.URL.RawQuery, code, err, text))
		switch {
		case !watching:
		case code == http.StatusServiceUnavailable:
			s.unavailable++
			s.text = text
			if s.failedAt == nil {
				s.failedAt, s.resumed, s.back = map[string]string{}, map[string][]string{}, map[string]bool{}
			}
			if _, ok := s.failedAt[resource]; !ok {
				s.failedAt[resource] = rv
			}
		case code == http.StatusOK:
			if _, failed := s.failedAt[resource]; failed {
				s.back[resource] = true
			}
		}
		return resp, err
	})
}

func (s *summaryRequests) serverReady() { close(s.ready) }

func (s *summaryRequests) lists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listed
}

func (s *summaryRequests) unavailableWatches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unavailable
}

func (s *summaryRequests) unavailableText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text
}

// watchesBack says whether every resource whose watch met a 503 has a
// watch open again. The other resource's watch may not meet it: one that
// ended while the server was down and is tried again only once it is back
// (its backoff outlasting a short restart) never asks the aggregator
// meanwhile. It must not list again either, which the count of lists
// checks.
func (s *summaryRequests) watchesBack() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.failedAt) > 0 && len(s.back) == len(s.failedAt)
}
