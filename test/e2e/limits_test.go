package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/waitfor"
)

// API limits the objects below are built to (validation of Kubernetes
// 1.36 and of the InferencePool CRD).
const (
	maxNamespaceName       = 63        // a DNS-1123 label
	maxObjectName          = 253       // a DNS-1123 subdomain, what a custom resource may be named
	maxServiceName         = 63        // a DNS-1035 label
	maxLabelValue          = 63        // label values, and the name part of a label key
	maxAnnotationsBytes    = 256 << 10 // keys and values of all annotations together
	maxTargetPorts         = 8         // the InferencePool CRD's spec.targetPorts maxItems
	maxEndpointsPerSlice   = 1000      // EndpointSlice validation
	maxConditionMessageLen = 32 * 1024 // metav1.Condition message
	eppServicePortCount    = 100       // no API maximum; far more than any EPP has
	eppEndpointSlices      = 10        // 10,000 endpoints behind the EPP Service
	hugeAnnotationValueLen = 250 << 10 // an export annotation value just under the total limit
	scalePools             = 10000     // pools in one namespace of one member
	scaleWorkers           = 32        // concurrent creators
	scalePageSize          = 500       // LIST limit when paging
	scaleTimeout           = 5 * time.Minute
)

// longName is a valid DNS name of exactly n characters.
func longName(prefix string, n int) string {
	return prefix + strings.Repeat("x", n-len(prefix)-1) + "z"
}

// requireValidServedConditions checks conditions as the API server would
// validate them if they were stored: what mci serves must be an object the
// API accepts.
func requireValidServedConditions(t *testing.T, what string, conds []metav1.Condition) {
	t.Helper()
	require.NotEmpty(t, conds, "%s has no conditions", what)
	errs := metav1validation.ValidateConditions(conds, field.NewPath("status", "conditions"))
	require.Empty(t, errs, "%s serves conditions the API would refuse", what)
	for _, c := range conds {
		assert.LessOrEqual(t, len(c.Message), maxConditionMessageLen, "%s: message of %s", what, c.Type)
	}
}

// An InferencePool and its EPP Service at the API's maximum sizes: names
// of maximum length, annotations just under 256 KiB, the most targetPorts
// the CRD allows, an EPP Service with a hundred ports and 10,000 endpoints
// in ten full EndpointSlices. The import is served through the aggregator
// with the right content and only valid conditions, for GET, LIST (label
// and field selectors) and WATCH; an export annotation whose value is
// 250 KiB is reported invalid in a message within the API's limit.
func TestObjectsAtAPIMaximumSizesAreImportedAndReportedWithinTheAPILimits(t *testing.T) {
	ctx := t.Context()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	ns := longName("e2e-limits-", maxNamespaceName)
	poolName := longName("llm-", maxObjectName)
	svcName := longName("epp-", maxServiceName)
	labelKey := longName("team.", maxObjectName) + "/" + longName("owner-", maxLabelValue)
	labelValue := longName("v", maxLabelValue)
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)

	// The EPP Service: a LoadBalancer with the EPP's three ports among a
	// hundred, some with names of maximum length.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer,
			// Nothing allocates node ports here that anyone would use.
			AllocateLoadBalancerNodePorts: ptr.To(false),
			Selector:                      map[string]string{"app": "epp"},
		},
	}
	for i := range eppServicePortCount - 3 {
		name := fmt.Sprintf("p-%03d", i)
		if i%10 == 0 {
			name = longName(fmt.Sprintf("p-%03d-", i), maxLabelValue)
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: name, Port: int32(20000 + i)})
	}
	svc.Spec.Ports = append(svc.Spec.Ports,
		corev1.ServicePort{Name: "ext-proc", Port: 9002},
		corev1.ServicePort{Name: "grpc-health", Port: 9003},
		corev1.ServicePort{Name: "http-metrics", Port: 9090},
	)
	created, err := a.kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.11"}}
	_, err = a.kube.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)

	// 10,000 endpoints, none ready but the last one. IPv6 documentation
	// addresses (2001:db8::/32): enough of them, and never routed.
	slices := a.kube.DiscoveryV1().EndpointSlices(ns)
	for s := range eppEndpointSlices {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", svcName[:50], s), Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
			AddressType: discoveryv1.AddressTypeIPv6,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("ext-proc"), Port: ptr.To[int32](9002)}},
		}
		for e := range maxEndpointsPerSlice {
			ready := s == eppEndpointSlices-1 && e == maxEndpointsPerSlice-1
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("2001:db8::%x:%x", s+1, e+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
			})
		}
		_, err := slices.Create(ctx, slice, metav1.CreateOptions{})
		require.NoError(t, err, "EndpointSlice %d", s)
	}

	// The pool: every size at its limit, its annotations just under the
	// total the API allows.
	pool := exportedPool(ns, poolName, v1alpha1.RoutingModeEndpoint)
	pool.Labels = map[string]string{labelKey: labelValue, "team": "llm"}
	pool.Spec.TargetPorts = nil
	for i := range maxTargetPorts {
		pool.Spec.TargetPorts = append(pool.Spec.TargetPorts, poolv1.Port{Number: int32(8000 + i)})
	}
	pool.Spec.EndpointPickerRef = poolv1.EndpointPickerRef{Name: svcName, Port: &poolv1.Port{Number: 9002}}
	used := 0
	for k, v := range pool.Annotations {
		used += len(k) + len(v)
	}
	const notesKey = "example.com/notes"
	pool.Annotations[notesKey] = strings.Repeat("n", maxAnnotationsBytes-used-len(notesKey)-16)
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, pool, metav1.CreateOptions{})
	require.NoError(t, err, "a pool with annotations just under 256 KiB")

	// A pool whose export annotation is all but the whole 256 KiB.
	huge := exportedPool(ns, "huge-export-value", v1alpha1.RoutingModeEndpoint)
	huge.Annotations[v1alpha1.ExportAnnotation] = strings.Repeat("c", hugeAnnotationValueLen)
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, huge, metav1.CreateOptions{})
	require.NoError(t, err)

	imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)
	var imp *v1alpha1.InferencePoolImport
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		imp, err = b.importOf(ctx, ns, poolName)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import not served yet (err=%v)", err)
		}
		return conditionStatus(imp.Status.Conditions, "Ready") == metav1.ConditionTrue, importClusters(imp)
	})

	t.Run("GET serves the import with everything the pool and its Service say", func(t *testing.T) {
		assert.Equal(t, poolName, imp.Name)
		assert.Equal(t, ns, imp.Namespace)
		assert.Equal(t, map[string]string{labelKey: labelValue, "team": "llm"}, imp.Labels)
		assert.Empty(t, imp.Annotations, "pool annotations are not copied to the import")
		require.Len(t, imp.Status.Clusters, 1)
		got := imp.Status.Clusters[0]
		assert.Equal(t, "cluster-a", got.Name)
		assert.Equal(t, int32(8000), got.TargetPortNumber, "the first of %d targetPorts", maxTargetPorts)
		assert.Equal(t, svcName, got.EndpointPicker.Name)
		require.Len(t, got.EndpointPicker.Service, 1)
		assert.Equal(t, []string{"127.0.0.11"}, got.EndpointPicker.Service[0].Addresses)
		assert.Equal(t, []v1alpha1.Port{{Number: 9002}}, got.EndpointPicker.Service[0].Ports)
		require.NotNil(t, got.EndpointPicker.Health)
		assert.Equal(t, int32(9003), got.EndpointPicker.Health.Port, "the health port, found among %d", eppServicePortCount)
		require.NotNil(t, got.EndpointPicker.Metrics)
		assert.Equal(t, int32(9090), got.EndpointPicker.Metrics.Port)
		for _, cond := range got.Conditions {
			if cond.Type == "Ready" {
				assert.Contains(t, cond.Message, "has 1 ready endpoint(s)", "one ready endpoint among %d", eppEndpointSlices*maxEndpointsPerSlice)
			}
		}
		requireValidServedConditions(t, "the import", imp.Status.Conditions)
		requireValidServedConditions(t, "the import's cluster-a entry", got.Conditions)
	})

	t.Run("LIST finds it by its long label and by its long name", func(t *testing.T) {
		byLabel, err := imports.List(ctx, metav1.ListOptions{LabelSelector: labelKey + "=" + labelValue})
		require.NoError(t, err)
		require.Len(t, byLabel.Items, 1)
		assert.Equal(t, poolName, byLabel.Items[0].Name)
		byName, err := imports.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", poolName).String()})
		require.NoError(t, err)
		require.Len(t, byName.Items, 1)
		assert.Equal(t, imp.UID, byName.Items[0].UID)
	})

	t.Run("a WATCH by its long name sees its last ready endpoint of 10,000 go", func(t *testing.T) {
		selector := fields.OneTermEqualSelector("metadata.name", poolName).String()
		list, err := imports.List(ctx, metav1.ListOptions{FieldSelector: selector})
		require.NoError(t, err)
		w, err := imports.Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
		require.NoError(t, err)
		defer w.Stop()

		last := fmt.Sprintf("%s-%d", svcName[:50], eppEndpointSlices-1)
		patch := fmt.Sprintf(`[{"op":"replace","path":"/endpoints/%d/conditions/ready","value":false}]`, maxEndpointsPerSlice-1)
		_, err = slices.Patch(ctx, last, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)

		deadline := time.After(convergence)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				require.True(t, ok, "the watch ended")
				if ev.Type == watch.Bookmark {
					continue
				}
				require.Equal(t, watch.Modified, ev.Type, "%v", ev.Object)
				got := ev.Object.(*v1alpha1.InferencePoolImport)
				require.Equal(t, poolName, got.Name)
				if conditionStatus(got.Status.Conditions, "Ready") != metav1.ConditionFalse {
					continue
				}
				ready := got.Status.Clusters[0].Conditions[0]
				assert.Equal(t, v1alpha1.ReasonNoReadyEndpoints, ready.Reason)
				assert.Contains(t, ready.Message, fmt.Sprintf("has %d endpoint(s), none ready", eppEndpointSlices*maxEndpointsPerSlice))
				requireValidServedConditions(t, "the watched import", got.Status.Conditions)
				return
			case <-deadline:
				t.Fatalf("no MODIFIED event within %s", convergence)
			}
		}
	})

	t.Run("the exporting cluster reports the export valid and where it is imported", func(t *testing.T) {
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, poolName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			byName := map[string]v1alpha1.ExportTargetCluster{}
			for _, cl := range exp.Status.Clusters {
				byName[cl.Name] = cl
			}
			return conditionStatus(exp.Status.Conditions, "Valid") == metav1.ConditionTrue &&
				byName["cluster-b"].Imported && byName[c.name].Reason == v1alpha1.ReasonNamespaceNotFound, fmt.Sprintf("%+v", exp.Status)
		})
		exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, poolName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, labelValue, exp.Labels[labelKey])
		requireValidServedConditions(t, "the export", exp.Status.Conditions)
	})

	t.Run("an export annotation of 250 KiB is reported invalid within the API's limit", func(t *testing.T) {
		var valid metav1.Condition
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, huge.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			requireValidServedConditions(t, "the export of the huge value", exp.Status.Conditions)
			for _, cond := range exp.Status.Conditions {
				if cond.Type == "Valid" {
					valid = cond
				}
			}
			return valid.Reason == v1alpha1.ReasonInvalidExport, valid.Reason
		})
		t.Logf("Valid condition message (%d bytes): %.300s...", len(valid.Message), valid.Message)
		assert.Equal(t, metav1.ConditionFalse, valid.Status)
		assert.Contains(t, valid.Message, v1alpha1.ExportAnnotation)
		assert.Contains(t, valid.Message, fmt.Sprintf("(%d bytes)", hugeAnnotationValueLen), "says how long the refused value is")
		assert.Contains(t, valid.Message, `the only allowed value is "ClusterSet"`, "says what to write instead")
		// The importer lists the cluster not Ready with the same message,
		// within the API's limits too.
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, huge.Name)
			if err != nil || imp == nil || len(imp.Status.Clusters) != 1 {
				return false, fmt.Sprintf("import: %v, %v", imp, err)
			}
			requireValidServedConditions(t, "the import of the huge value", imp.Status.Conditions)
			requireValidServedConditions(t, "the imported cluster of the huge value", imp.Status.Clusters[0].Conditions)
			c := meta.FindStatusCondition(imp.Status.Clusters[0].Conditions, v1alpha1.ConditionReady)
			return c != nil && c.Reason == v1alpha1.ReasonInvalidExport && strings.Contains(c.Message, fmt.Sprintf("(%d bytes)", hugeAnnotationValueLen)), fmt.Sprintf("%+v", c)
		})
	})
}

// scaleClient is an admin client of cluster for many requests at once,
// without the default client-side rate limit of 5 per second.
func scaleClient(t *testing.T, cluster string) mciclient.Interface {
	t.Helper()
	c, err := clusters.Cluster(cluster)
	require.NoError(t, err)
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 5000, 5000
	return mciclient.NewForConfigOrDie(cfg)
}

// inParallel runs do(0) ... do(n-1) on workers goroutines and returns the
// first error; after one, no new call starts.
func inParallel(n, workers int, do func(i int) error) error {
	next := make(chan int)
	var (
		once  sync.Once
		first error
		wg    sync.WaitGroup
	)
	failed := make(chan struct{})
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					once.Do(func() { first = err; close(failed) })
					return
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-failed:
			break feed
		}
	}
	close(next)
	wg.Wait()
	return first
}

// countingWatch follows imports from resourceVersion rv as a client that
// is not an informer does: when the server ends the watch (it cuts off a
// watcher that falls too far behind), it watches again from the last
// resourceVersion it saw. It counts the distinct imports it sees ADDED.
type countingWatch struct {
	added    atomic.Int64
	rewatch  atomic.Int64
	allAdded chan struct{}
	err      atomic.Value
}

func watchCounting(ctx context.Context, imports interface {
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}, rv string, want int) *countingWatch {
	cw := &countingWatch{allAdded: make(chan struct{})}
	go func() {
		seen := map[string]bool{}
		for ctx.Err() == nil {
			w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				if ctx.Err() == nil {
					cw.err.Store(err)
				}
				return
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					cw.err.Store(fmt.Errorf("watch error: %v", ev.Object))
					w.Stop()
					return
				}
				imp, ok := ev.Object.(*v1alpha1.InferencePoolImport)
				if !ok {
					continue
				}
				rv = imp.ResourceVersion
				if ev.Type == watch.Added && !seen[imp.Name] {
					seen[imp.Name] = true
					if cw.added.Add(1) == int64(want) {
						close(cw.allAdded)
					}
				}
			}
			w.Stop()
			cw.rewatch.Add(1)
		}
	}()
	return cw
}

// 10,000 exported pools in one namespace of one member, created by 32
// concurrent clients: a watch through the aggregator sees every import
// arrive; LIST returns all 10,000, and so does paging with limit and
// continue, without a duplicate; GET of one works; a WATCH from the LIST's
// resourceVersion sees the next change and nothing before it.
func TestTenThousandPoolsInOneNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), scaleTimeout)
	defer cancel()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-ten-thousand"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	a.createEPPService(t, ctx, ns, "127.0.0.12")
	a.setEPPEndpoint(t, ctx, ns, true)
	aPools := scaleClient(t, "cluster-a").InferencePoolV1().InferencePools(ns)
	imports := scaleClient(t, "cluster-b").InferenceV1alpha1().InferencePoolImports(ns)
	name := func(i int) string { return fmt.Sprintf("pool-%05d", i) }

	// Without a namespace controller, deleting the namespace would leave
	// the pools, and every later LIST of all namespaces would carry them.
	t.Cleanup(func() {
		cleanupCtx, cancel := context.WithTimeout(context.Background(), scaleTimeout)
		defer cancel()
		start := time.Now()
		err := inParallel(scalePools, scaleWorkers, func(i int) error {
			err := aPools.Delete(cleanupCtx, name(i), metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
		if err != nil {
			t.Errorf("deleting the pools: %v", err)
			return
		}
		deleted := time.Since(start)
		waitfor.Eventually(t, cleanupCtx, scaleTimeout, func(ctx context.Context) (bool, string) {
			list, err := imports.List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				return false, err.Error()
			}
			return len(list.Items) == 0, fmt.Sprintf("%d imports left", len(list.Items))
		})
		t.Logf("%d pools deleted in %s; their imports gone from cluster-b %s later", scalePools, deleted.Round(100*time.Millisecond), (time.Since(start) - deleted).Round(100*time.Millisecond))
	})

	// The watcher that counts imports as they arrive, from an empty LIST.
	empty, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, empty.Items)
	counter := watchCounting(ctx, imports, empty.ResourceVersion, scalePools)

	start := time.Now()
	err = inParallel(scalePools, scaleWorkers, func(i int) error {
		_, err := aPools.Create(ctx, exportedPool(ns, name(i), v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
		return err
	})
	require.NoError(t, err)
	createdIn := time.Since(start)
	t.Logf("%d pools created by %d workers in %s (%.0f/s)", scalePools, scaleWorkers, createdIn.Round(100*time.Millisecond), scalePools/createdIn.Seconds())

	select {
	case <-counter.allAdded:
	case <-ctx.Done():
		t.Fatalf("the watch saw %d of %d imports (error: %v)", counter.added.Load(), scalePools, counter.err.Load())
	}
	t.Logf("every import ADDED on a watch through the aggregator %s after the first create, %s after the last (the server cut the watcher off %d time(s) and it resumed from its last resourceVersion)",
		time.Since(start).Round(100*time.Millisecond), (time.Since(start) - createdIn).Round(100*time.Millisecond), counter.rewatch.Load())

	want := make(map[string]bool, scalePools)
	for i := range scalePools {
		want[name(i)] = true
	}
	requireAll := func(t *testing.T, what string, names []string) {
		t.Helper()
		seen := make(map[string]bool, len(names))
		for _, n := range names {
			require.False(t, seen[n], "%s: %s twice", what, n)
			require.True(t, want[n], "%s: %s was never created", what, n)
			seen[n] = true
		}
		require.Len(t, seen, scalePools, "%s", what)
	}

	listStart := time.Now()
	list, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	t.Logf("LIST of %d imports through the aggregator: %s", len(list.Items), time.Since(listStart).Round(time.Millisecond))
	names := make([]string, 0, len(list.Items))
	for i := range list.Items {
		names = append(names, list.Items[i].Name)
	}
	requireAll(t, "LIST", names)

	t.Run("paging with limit and continue returns each import once", func(t *testing.T) {
		pageStart := time.Now()
		var paged []string
		opts := metav1.ListOptions{Limit: scalePageSize}
		pages := 0
		for {
			page, err := imports.List(ctx, opts)
			require.NoError(t, err, "page %d", pages)
			pages++
			require.LessOrEqual(t, len(page.Items), scalePageSize)
			for i := range page.Items {
				paged = append(paged, page.Items[i].Name)
			}
			if page.Continue == "" {
				break
			}
			require.Less(t, pages, 2*scalePools/scalePageSize, "paging does not end")
			opts.Continue = page.Continue
		}
		t.Logf("%d pages of %d: %s", pages, scalePageSize, time.Since(pageStart).Round(time.Millisecond))
		requireAll(t, "paged LIST", paged)
		assert.Equal(t, scalePools/scalePageSize, pages)
	})

	t.Run("GET serves one of them", func(t *testing.T) {
		imp, err := imports.Get(ctx, name(4242), metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "cluster-a:Ready", importClusters(imp))
	})

	t.Run("a WATCH from the LIST's resourceVersion sees the next change first", func(t *testing.T) {
		w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		require.NoError(t, err)
		defer w.Stop()
		changed := time.Now()
		_, err = aPools.Patch(ctx, name(4242), types.MergePatchType, []byte(`{"metadata":{"labels":{"tier":"gold"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		deadline := time.After(convergence)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				require.True(t, ok, "the watch ended")
				if ev.Type == watch.Bookmark {
					continue
				}
				imp := ev.Object.(*v1alpha1.InferencePoolImport)
				require.Equal(t, watch.Modified, ev.Type, "%s %s: the watch replays what the LIST already had", ev.Type, imp.Name)
				require.Equal(t, name(4242), imp.Name)
				assert.Equal(t, "gold", imp.Labels["tier"])
				t.Logf("the change reached the watch in %s", time.Since(changed).Round(time.Millisecond))
				return
			case <-deadline:
				t.Fatalf("no event within %s", convergence)
			}
		}
	})
}
