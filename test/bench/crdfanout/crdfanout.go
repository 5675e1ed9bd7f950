// Package crdfanout is the CRD fan-out baseline of the benchmarks in
// test/bench, and nothing else: a minimal controller that does what the
// Multi-Cluster Inference proposal's reference design does. It watches the
// InferencePools (and the Services, EndpointSlices, Gateways and Namespaces
// they depend on) of every member cluster and, on every change, writes an
// InferencePoolImport custom resource into each member and rewrites its
// status.
//
// It is a yardstick, not a product. To compare mci against the baseline's
// best case, it computes exactly what mci-apiserver serves (pkg/imports on
// the same caches), writes every target cluster in parallel, and skips
// writes that would change nothing. Its objects live in their own API group
// (baseline.mci.x-k8s.io) so that it can run in the same ClusterSet as
// mci-apiserver, whose APIService owns inference.networking.x-k8s.io.
package crdfanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewayinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/mci-dev/mci/pkg/apis/inference/install"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
	"github.com/mci-dev/mci/pkg/imports"
)

// Group is the API group of the baseline's InferencePoolImport custom
// resources.
const Group = "baseline.mci.x-k8s.io"

// GVR is the baseline's InferencePoolImport resource.
var GVR = schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: "inferencepoolimports"}

// CRD returns the CustomResourceDefinition of the baseline's imports: the
// upstream InferencePoolImport's shape (namespaced, status subresource) with
// a schema that keeps every field, so the stored objects carry exactly what
// mci-apiserver serves.
func CRD() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": GVR.Resource + "." + GVR.Group},
		"spec": map[string]any{
			"group": GVR.Group,
			"scope": "Namespaced",
			"names": map[string]any{
				"plural": GVR.Resource, "singular": "inferencepoolimport",
				"kind": "InferencePoolImport", "listKind": "InferencePoolImportList",
			},
			"versions": []any{map[string]any{
				"name": GVR.Version, "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
}

// Member is one member cluster: its name and an identity that may read
// what the computation needs and write the baseline's imports.
type Member struct {
	Name   string
	Config *rest.Config
}

// Options configure a Controller.
type Options struct {
	// ClusterSetName seeds the computation exactly as mci-apiserver's
	// --clusterset-name does.
	ClusterSetName string
	// Members are every member cluster; all are watched.
	Members []Member
	// Targets are the members written to; every member when empty. The
	// benchmarks restrict it where only one member's copy is measured.
	Targets []string
	// Namespace restricts the controller to one namespace ("" = all), so
	// that benchmarks of mci in other namespaces do not load it.
	Namespace string
	// Workers is how many keys are synced at once; 4 when 0.
	Workers int
}

// Controller is the CRD fan-out baseline.
type Controller struct {
	opts    Options
	scheme  *runtime.Scheme
	members []*member
	targets []*member
	queue   workqueue.TypedRateLimitingInterface[string]

	writes atomic.Int64
	synced chan struct{}
}

type member struct {
	name    string
	view    imports.Member
	crs     cache.GenericLister
	dynamic dynamic.NamespaceableResourceInterface
	start   []func(stop <-chan struct{})
	hasSync []cache.InformerSynced
}

// New builds the controller's informers; Run starts them.
func New(opts Options) (*Controller, error) {
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	scheme := runtime.NewScheme()
	install.Install(scheme)
	c := &Controller{
		opts:   opts,
		scheme: scheme,
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		synced: make(chan struct{}),
	}
	targets := map[string]bool{}
	for _, t := range opts.Targets {
		targets[t] = true
	}
	for _, mo := range opts.Members {
		m, err := c.newMember(mo)
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", mo.Name, err)
		}
		c.members = append(c.members, m)
		if len(targets) == 0 || targets[mo.Name] {
			c.targets = append(c.targets, m)
		}
	}
	// The computation expects members sorted by name.
	slices.SortFunc(c.members, func(a, b *member) int { return strings.Compare(a.name, b.name) })
	return c, nil
}

func (c *Controller) newMember(mo Member) (*member, error) {
	cfg := rest.CopyConfig(mo.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mci, err := mciclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	gw, err := gatewayclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ns := c.opts.Namespace
	kubeNS := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithNamespace(ns))
	kubeAll := kubeinformers.NewSharedInformerFactory(kube, 0)
	pools := mciinformers.NewSharedInformerFactoryWithOptions(mci, 0, mciinformers.WithNamespace(ns))
	gws := gatewayinformers.NewSharedInformerFactoryWithOptions(gw, 0, gatewayinformers.WithNamespace(ns))
	crs := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)

	m := &member{name: mo.Name, dynamic: dyn.Resource(GVR)}
	poolInf := pools.InferencePool().V1().InferencePools()
	svcInf := kubeNS.Core().V1().Services()
	sliceInf := kubeNS.Discovery().V1().EndpointSlices()
	nsInf := kubeAll.Core().V1().Namespaces()
	gwInf := gws.Gateway().V1().Gateways()
	crInf := crs.ForResource(GVR)
	m.view = imports.Member{
		Name:           mo.Name,
		Namespaces:     nsInf.Lister(),
		Pools:          poolInf.Lister(),
		Services:       svcInf.Lister(),
		EndpointSlices: sliceInf.Lister(),
		Gateways:       gwInf.Lister(),
	}
	m.crs = crInf.Lister()

	handlers := []struct {
		inf cache.SharedIndexInformer
		key func(obj any) []string
	}{
		{poolInf.Informer(), func(obj any) []string { return []string{objectKey(obj)} }},
		{svcInf.Informer(), func(obj any) []string { return c.poolsUsing(namespaceOf(obj), nameOf(obj)) }},
		{sliceInf.Informer(), func(obj any) []string {
			s, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok {
				return nil
			}
			return c.poolsUsing(s.Namespace, s.Labels[discoveryv1.LabelServiceName])
		}},
		{gwInf.Informer(), func(obj any) []string { return c.poolsUsing(namespaceOf(obj), "") }},
		{nsInf.Informer(), func(obj any) []string { return c.poolsUsing(nameOf(obj), "") }},
		{crInf.Informer(), func(obj any) []string { return []string{objectKey(obj)} }},
	}
	for _, h := range handlers {
		enqueue := func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			for _, k := range h.key(obj) {
				c.queue.Add(k)
			}
		}
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
			DeleteFunc: enqueue,
		}); err != nil {
			return nil, err
		}
		m.hasSync = append(m.hasSync, h.inf.HasSynced)
	}
	m.start = []func(<-chan struct{}){kubeNS.Start, kubeAll.Start, pools.Start, gws.Start, crs.Start}
	return m, nil
}

// poolsUsing returns the keys of every member's pools in namespace whose
// EPP Service is service ("" = every pool of the namespace).
func (c *Controller) poolsUsing(namespace, service string) []string {
	if c.opts.Namespace != "" && namespace != c.opts.Namespace {
		return nil
	}
	var keys []string
	for _, m := range c.members {
		ps, err := m.view.Pools.InferencePools(namespace).List(everything)
		if err != nil {
			continue
		}
		for _, p := range ps {
			if service == "" || p.Spec.EndpointPickerRef.Name == service {
				keys = append(keys, p.Namespace+"/"+p.Name)
			}
		}
	}
	return keys
}

// Writes is how many writes the controller has issued to member clusters.
func (c *Controller) Writes() int64 { return c.writes.Load() }

// Synced is closed once every informer has synced and the workers run.
func (c *Controller) Synced() <-chan struct{} { return c.synced }

// Run runs the controller until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	var synced []cache.InformerSynced
	for _, m := range c.members {
		for _, start := range m.start {
			start(ctx.Done())
		}
		synced = append(synced, m.hasSync...)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("crdfanout: informers did not sync")
	}
	var wg sync.WaitGroup
	for range c.opts.Workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	close(c.synced)
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(ctx, key); err != nil && ctx.Err() == nil {
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// sync recomputes the import of key for every target and writes the
// differences, all targets at once.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	views := make([]imports.Member, len(c.members))
	for i, m := range c.members {
		views[i] = m.view
	}
	errs := make([]error, len(c.targets))
	var wg sync.WaitGroup
	for i, t := range c.targets {
		wg.Go(func() {
			cs := imports.ClusterSet{Name: c.opts.ClusterSetName, Local: t.name, Members: views}
			errs[i] = c.syncTarget(ctx, cs, t, ns, name)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *Controller) syncTarget(ctx context.Context, cs imports.ClusterSet, t *member, ns, name string) error {
	var existing *unstructured.Unstructured
	if obj, err := t.crs.ByNamespace(ns).Get(name); err == nil {
		existing, _ = obj.(*unstructured.Unstructured)
	}
	imp, ok := imports.Import(cs, ns, name)
	api := t.dynamic.Namespace(ns)
	if !ok {
		if existing == nil {
			return nil
		}
		c.writes.Add(1)
		err := api.Delete(ctx, name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	var out v1alpha1.InferencePoolImport
	if err := c.scheme.Convert(imp, &out, nil); err != nil {
		return err
	}
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&out.Status)
	if err != nil {
		return err
	}
	if existing != nil {
		current, _, _ := unstructured.NestedMap(existing.Object, "status")
		if apiequality.Semantic.DeepEqual(withoutTimes(current), withoutTimes(status)) {
			return nil
		}
	}
	stampTimes(status, metav1.Now().UTC().Format(time.RFC3339))
	if existing == nil {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": GVR.GroupVersion().String(),
			"kind":       "InferencePoolImport",
			"metadata":   map[string]any{"name": name, "namespace": ns},
		}}
		if len(out.Labels) > 0 {
			labels := map[string]any{}
			for k, v := range out.Labels {
				labels[k] = v
			}
			obj.Object["metadata"].(map[string]any)["labels"] = labels
		}
		c.writes.Add(1)
		created, err := api.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return err // the informer has not seen it yet: retry
		}
		if err != nil {
			return err
		}
		existing = created
	}
	existing = existing.DeepCopy()
	existing.Object["status"] = status
	c.writes.Add(1)
	_, err = api.UpdateStatus(ctx, existing, metav1.UpdateOptions{})
	return err
}

// withoutTimes copies a status without its lastTransitionTime fields, which
// the computation leaves zero and the controller stamps when it writes.
func withoutTimes(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			if k != "lastTransitionTime" {
				out[k] = withoutTimes(x)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = withoutTimes(x)
		}
		return out
	}
	return v
}

func stampTimes(v any, now string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if k == "lastTransitionTime" {
				v[k] = now
				continue
			}
			stampTimes(x, now)
		}
	case []any:
		for _, x := range v {
			stampTimes(x, now)
		}
	}
}

var everything = labels.Everything()

func objectKey(obj any) string {
	k, _ := cache.MetaNamespaceKeyFunc(obj)
	return k
}

func namespaceOf(obj any) string {
	if o, ok := obj.(metav1.Object); ok {
		return o.GetNamespace()
	}
	return ""
}

func nameOf(obj any) string {
	if o, ok := obj.(metav1.Object); ok {
		return o.GetName()
	}
	return ""
}
