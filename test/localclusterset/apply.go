package localclusterset

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// fieldManager owns what the harness applies, for server-side apply.
const fieldManager = "mci-clusterset"

// ApplyFiles applies every object in the YAML files at paths (files, or
// directories of *.yaml) to cluster, as Apply does, and returns what it
// applied as "resource/namespace/name" lines.
func (cs *ClusterSet) ApplyFiles(ctx context.Context, cluster string, paths ...string) ([]string, error) {
	objs, err := readObjects(paths)
	if err != nil {
		return nil, err
	}
	return cs.Apply(ctx, cluster, objs...)
}

// Apply creates or updates objects in cluster with server-side apply, and
// then writes the status that an object carries through its status
// subresource: no kubelet, cloud or gateway controller runs in the local
// ClusterSet (only the kube-controller-manager's nodeless controllers), so
// the harness writes what they would (a LoadBalancer ingress, a Pod IP, a
// Gateway's addresses). Namespaces are applied first; objects without a
// namespace go to "default".
func (cs *ClusterSet) Apply(ctx context.Context, cluster string, objs ...*unstructured.Unstructured) ([]string, error) {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return nil, err
	}
	kube, dyn, err := clients(c.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kube.Discovery()))
	objs = slices.Clone(objs)
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
		return namespaceFirst(a) - namespaceFirst(b)
	})
	var applied []string
	for _, obj := range objs {
		what, err := applyOne(ctx, dyn, mapper, obj)
		if err != nil {
			return applied, fmt.Errorf("%s: %w", cluster, err)
		}
		applied = append(applied, what)
	}
	return applied, nil
}

func namespaceFirst(o *unstructured.Unstructured) int {
	if o.GetKind() == "Namespace" && o.GroupVersionKind().Group == "" {
		return 0
	}
	return 1
}

func applyOne(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) (string, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", gvk, obj.GetName(), err)
	}
	var api dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	what := mapping.Resource.GroupResource().String() + "/" + obj.GetName()
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		api = dyn.Resource(mapping.Resource).Namespace(ns)
		what = mapping.Resource.GroupResource().String() + "/" + ns + "/" + obj.GetName()
	}
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}

	status, hasStatus := obj.Object["status"]
	spec := obj.DeepCopy()
	delete(spec.Object, "status")
	if _, err := api.Apply(ctx, obj.GetName(), spec, opts); err != nil {
		return "", fmt.Errorf("applying %s: %w", what, err)
	}
	if !hasStatus {
		return what, nil
	}
	statusOnly := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": obj.GetAPIVersion(),
		"kind":       obj.GetKind(),
		"metadata":   map[string]any{"name": obj.GetName(), "namespace": obj.GetNamespace()},
		"status":     status,
	}}
	_, err = api.ApplyStatus(ctx, obj.GetName(), statusOnly, opts)
	if apierrors.IsNotFound(err) {
		// No status subresource: status is an ordinary field of the object.
		_, err = api.Apply(ctx, obj.GetName(), obj, opts)
	}
	if err != nil {
		return "", fmt.Errorf("writing the status of %s: %w", what, err)
	}
	return what + " (with status)", nil
}
