package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// These tests run mci-sidecar on the local ClusterSet like sidecar_test.go,
// with the loopback blocks 127.0.85-89.x.

// try sends one completion request through the gateway; safe to call from
// any goroutine.
func (s *sidecarSetup) try(ctx context.Context) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.gateway.URL+"/v1/completions", strings.NewReader(string(completion(baseModel))))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := noProxyClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, "", err
	}
	return resp.StatusCode, resp.Header.Get(simulator.InstanceHeader), nil
}

// spreadParallel sends n requests over workers connections and counts
// where they land, as spread does.
func (s *sidecarSetup) spreadParallel(t *testing.T, n, workers int) map[string]int {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	var firstErr error
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range jobs {
				code, instance, err := s.try(t.Context())
				mu.Lock()
				switch {
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
					got["error"]++
				case code != http.StatusOK:
					got["HTTP "+strconv.Itoa(code)]++
				default:
					got[instance]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, firstErr)
	return got
}

// settle waits until n requests in a row satisfy ok.
func (s *sidecarSetup) settle(t *testing.T, timeout time.Duration, n int, what string, ok func(code int, instance string) bool) {
	t.Helper()
	start := time.Now()
	waitfor.Eventually(t, t.Context(), timeout, func(ctx context.Context) (bool, string) {
		for i := range n {
			code, instance, err := s.try(ctx)
			if err != nil || !ok(code, instance) {
				return false, fmt.Sprintf("%s: request %d of %d got HTTP %d from %q (err=%v)", what, i+1, n, code, instance, err)
			}
		}
		return true, ""
	})
	t.Logf("%s: %d requests in a row after %s", what, n, time.Since(start).Round(time.Millisecond))
}

// annotateRoute replaces the annotations of cluster-b's HTTPRoute.
func (s *sidecarSetup) annotateRoute(t *testing.T, annotations map[string]string) {
	t.Helper()
	routes := s.b.gateway.GatewayV1().HTTPRoutes(s.ns)
	r, err := routes.Get(t.Context(), "completions", metav1.GetOptions{})
	require.NoError(t, err)
	r.Annotations = annotations
	_, err = routes.Update(t.Context(), r, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func TestSidecarSplitsShedsWithdrawsAndFailsClosedAcrossTheClusterSet(t *testing.T) {
	weighted := map[string]string{
		routetable.PolicyAnnotation:      routingpolicy.Weighted,
		routetable.FailureModeAnnotation: "FailClose",
	}
	s := newSidecarSetupWith(t, "e2e-sidecar-routing", sidecarOptions{
		blockA: 85, blockC: 87, sidecarIP: "127.0.86.1",
		routeAnnotations: weighted,
		inferenceModels:  true,
		probeInterval:    200 * time.Millisecond,
	})
	simA, simC := s.instances["cluster-a"], s.instances["cluster-c"]

	t.Run("2,000 requests split 50/50 within statistical bounds", func(t *testing.T) {
		const n = 2000
		start := time.Now()
		got := s.spreadParallel(t, n, 4)
		t.Logf("%d requests in %s: %v", n, time.Since(start).Round(time.Millisecond), got)
		// On a loaded machine a request may exceed the gateway's ext_proc
		// message timeout (504): a handful is tolerated, not more.
		answered := got[simA] + got[simC]
		require.GreaterOrEqual(t, answered, n-10, "requests are answered by cluster-a or cluster-c: %v", got)
		// A fair coin would stay within 4 standard deviations (sqrt(n)/2
		// = 22) of n/2 but once in 15,000 runs; smooth weighted
		// round-robin is exact, so any skew comes from the table, not luck.
		for _, inst := range []string{simA, simC} {
			assert.InDelta(t, answered/2, got[inst], 90, "%s's share: %v", inst, got)
		}
	})

	t.Run("sheddable requests are shed only when every cluster is saturated", func(t *testing.T) {
		_, err := s.b.mci.InferenceV1alpha2().InferenceModels(s.ns).Create(t.Context(), &v1alpha2.InferenceModel{
			ObjectMeta: metav1.ObjectMeta{Name: "sheddable", Namespace: s.ns},
			Spec: v1alpha2.InferenceModelSpec{
				ModelName:   baseModel,
				Criticality: ptr.To(v1alpha2.Sheddable),
				PoolRef:     v1alpha2.PoolObjectReference{Name: "llm"},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		s.annotateRoute(t, map[string]string{
			routetable.PolicyAnnotation:      routingpolicy.MetricsBased,
			routetable.FailureModeAnnotation: "FailClose",
		})
		defer func() {
			s.servers["cluster-a"].pin(t, 0, 0.1)
			s.servers["cluster-c"].pin(t, 0, 0.1)
			s.annotateRoute(t, weighted)
		}()

		// cluster-a saturated (queue 10 > 5), cluster-c has capacity.
		s.servers["cluster-a"].pin(t, 10, 0.9)
		s.servers["cluster-c"].pin(t, 0, 0.1)
		defer func() {
			if t.Failed() {
				for name, e := range s.epps {
					m, err := promtext.Get(t.Context(), "http://"+e.ip+":"+strconv.Itoa(eppMetricsPort)+"/metrics")
					if err != nil {
						t.Logf("%s metrics: %v", name, err)
						continue
					}
					for metric := range m {
						if strings.HasPrefix(metric, "inference_pool_") {
							t.Logf("%s: %s %v", name, metric, m.Samples(metric))
						}
					}
				}
				t.Logf("table problems: %v", s.sidecar.Router().Table().Errors)
			}
		}()
		s.settle(t, 30*time.Second, 30, "only cluster-a saturated: sheddable requests go to cluster-c", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simC
		})

		s.servers["cluster-c"].pin(t, 10, 0.95)
		s.settle(t, 30*time.Second, 30, "both saturated: sheddable requests are shed", func(code int, _ string) bool {
			return code == http.StatusTooManyRequests
		})

		s.servers["cluster-a"].pin(t, 0, 0.1)
		s.settle(t, 30*time.Second, 30, "cluster-a has capacity again: sheddable requests go to cluster-a", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simA
		})
	})

	t.Run("an exporter's inline policy crosses the ClusterSet on the import and routes the sidecar", func(t *testing.T) {
		ctx := t.Context()
		const inline = " in-flight=1, pick=two-choices"
		canonical := "in-flight=1,pick=two-choices,filters=health+ready+weight+model+saturation,affinity-margin=1,queue-margin=1,home-bound=off"
		setPolicy := func(v string) {
			for _, name := range []string{"cluster-a", "cluster-c"} {
				clusterClients(t, name).editPool(t, ctx, s.ns, "llm", func(p *poolv1.InferencePool) {
					if v == "" {
						delete(p.Annotations, v1alpha1.ClusterPolicyAnnotation)
					} else {
						p.Annotations[v1alpha1.ClusterPolicyAnnotation] = v
					}
				})
			}
		}
		// The route's policy wins over the import's: it names none here.
		s.annotateRoute(t, map[string]string{routetable.FailureModeAnnotation: "FailClose"})
		setPolicy(inline)
		defer func() {
			setPolicy("")
			s.annotateRoute(t, weighted)
		}()

		imports := s.b.mci.InferenceV1alpha1().InferencePoolImports(s.ns)
		waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
			imp, err := imports.Get(ctx, "llm", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got := imp.Annotations[v1alpha1.ClusterPolicyAnnotation]
			return got == canonical, fmt.Sprintf("cluster-b's import carries policy %q", got)
		})
		waitfor.Eventually(t, ctx, 10*time.Second, func(context.Context) (bool, string) {
			for b := range s.sidecar.Router().Table().Backends {
				if b.Namespace == s.ns && b.Name == "llm" && b.Kind == routetable.BackendInferencePoolImport {
					return b.Policy.Name == canonical && b.Scoring().Config().Name == canonical, fmt.Sprintf("the sidecar routes by %q", b.Policy.Name)
				}
			}
			return false, "the sidecar has no backend for the import"
		})
		got := s.spread(t, 50)
		assert.Equal(t, 50, got[simA]+got[simC], "every request is answered by cluster-a or cluster-c: %v", got)
	})

	t.Run("withdrawing cluster-c's export removes it from routing within one watch event", func(t *testing.T) {
		ctx := t.Context()
		imports := s.b.mci.InferenceV1alpha1().InferencePoolImports(s.ns)
		list, err := imports.List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		require.NoError(t, err)
		defer w.Stop()

		withdrawn := time.Now()
		clusterClients(t, "cluster-c").editPool(t, ctx, s.ns, "llm", func(p *poolv1.InferencePool) {
			delete(p.Annotations, v1alpha1.ExportAnnotation)
			delete(p.Annotations, v1alpha1.ExportModeAnnotation)
		})

		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-time.After(30 * time.Second):
			t.Fatal("no watch event within 30s of the withdrawal")
		}
		received := time.Now()
		require.Equal(t, watch.Modified, ev.Type, "%+v", ev)
		imp := ev.Object.(*v1alpha1.InferencePoolImport)
		var names []string
		for _, ic := range imp.Status.Clusters {
			names = append(names, ic.Name)
		}
		require.Equal(t, []string{"cluster-a"}, names, "the first watch event after the withdrawal no longer lists cluster-c")
		t.Logf("cluster-b's import watch event arrived %s after the withdrawal", received.Sub(withdrawn).Round(time.Millisecond))

		// The sidecar's informer gets the same event: its table follows
		// (polled every millisecond: the delay is measured).
		want := fmt.Sprint(map[string]string{"cluster-a": s.epps["cluster-a"].ip + ":" + strconv.Itoa(eppGRPCPort)})
		waitfor.EventuallyEvery(t, ctx, time.Millisecond, 10*time.Second, func(context.Context) (bool, string) {
			got := eppsOf(s.sidecar.Router().Table(), s.ns, "llm")
			return fmt.Sprint(got) == want, fmt.Sprintf("the sidecar still routes to %v", got)
		})
		t.Logf("the sidecar's table dropped cluster-c %s after this test's watch event", time.Since(received).Round(time.Millisecond))

		got := s.spread(t, 100)
		assert.Equal(t, map[string]int{simA: 100}, got, "every request lands in cluster-a")
	})

	t.Run("with cluster-a's EPP down and no cluster left, FailClose answers 503", func(t *testing.T) {
		s.epps["cluster-a"].stop()
		s.settle(t, 20*time.Second, 30, "no EPP left", func(code int, _ string) bool {
			return code == http.StatusServiceUnavailable
		})
	})

	t.Run("a region-restricted route never reaches a cluster outside its regions, even with every cluster inside down", func(t *testing.T) {
		ctx := t.Context()
		// cluster-a (its EPP down) states eu-west-1; cluster-c, exported
		// again, states us-east-1 and a weight that would take nearly
		// every request.
		for name, settings := range map[string]string{
			"cluster-a": `{"region": "eu-west-1"}`,
			"cluster-c": `{"region": "us-east-1", "weight": 1000}`,
		} {
			clusterClients(t, name).editPool(t, ctx, s.ns, "llm", func(p *poolv1.InferencePool) {
				p.Annotations[v1alpha1.ExportAnnotation] = v1alpha1.ExportScopeClusterSet
				p.Annotations[v1alpha1.ExportSettingsAnnotation] = settings
			})
		}
		restricted := func(regions string) map[string]string {
			return map[string]string{
				routetable.PolicyAnnotation:         routingpolicy.Weighted,
				routetable.FailureModeAnnotation:    "FailOpen",
				routetable.ClusterRegionsAnnotation: regions,
			}
		}
		s.annotateRoute(t, restricted("us-east-1"))
		s.settle(t, 30*time.Second, 30, "restricted to us-east-1: cluster-c serves", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simC
		})

		s.annotateRoute(t, restricted("eu-west-1"))
		s.settle(t, 30*time.Second, 30, "restricted to eu-west-1, whose only cluster is down: 503", func(code int, _ string) bool {
			return code == http.StatusServiceUnavailable
		})
		got := s.spread(t, 100)
		assert.Equal(t, map[string]int{"HTTP 503": 100}, got, "no request leaves eu-west-1 for the live cluster-c, FailOpen or not")

		s.annotateRoute(t, restricted("ap-south-1"))
		s.expectProblem(t, routetable.ReasonNoClustersInRegions, "cluster-c (us-east-1)")
		s.settle(t, 30*time.Second, 10, "restricted to a region of no cluster: 503", func(code int, _ string) bool {
			return code == http.StatusServiceUnavailable
		})
		// Each answer outside the regions is counted as such. The count is
		// read after the settle, once it has stopped moving (a request is
		// counted just after its answer is sent): some of the settle's
		// first 503s may have come from the table before, whose only
		// cluster was down (another outcome).
		const outside = `mci_sidecar_requests_total{cluster="",code="503",outcome="outside_regions"}`
		before := s.settledMetric(t, outside)
		for range 3 {
			code, _, body := s.send(t)
			assert.Equal(t, http.StatusServiceUnavailable, code)
			assert.Contains(t, body, "no cluster in region(s) ap-south-1", "the 503 says why")
		}
		s.expectMetric(t, outside, before+3)
	})
}

func TestSidecarAsAnEPPShimMakesAGatewayMultiCluster(t *testing.T) {
	s := newSidecarSetupWith(t, "e2e-sidecar-shim", sidecarOptions{
		blockA: 88, blockC: 89, sidecarIP: "127.0.88.200",
		shim: true,
	})
	simA, simC := s.instances["cluster-a"], s.instances["cluster-c"]

	// cluster-b has no HTTPRoute: the gateway calls the sidecar as the EPP
	// of its InferencePool "llm", and the sidecar serves it with the
	// clusters of the import of the same name.
	routes, err := s.b.gateway.GatewayV1().HTTPRoutes(s.ns).List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, routes.Items)

	const n = 200
	got := s.spreadParallel(t, n, 2)
	t.Logf("%d requests through the shim: %v", n, got)
	require.GreaterOrEqual(t, got[simA]+got[simC], n-5, "requests are answered by cluster-a or cluster-c: %v", got)
	for _, inst := range []string{simA, simC} {
		assert.GreaterOrEqual(t, got[inst], n*30/100, "%s gets its share: %v", inst, got)
	}
}
