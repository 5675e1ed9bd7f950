package routetable

import (
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// backend resolves one backendRef of rule ri.
func (b *builder) backend(r *gatewayv1.HTTPRoute, ri, bi int, ref gatewayv1.BackendRef, ra routeAnnotations) *Backend {
	group, kind, ns := refTarget(r.Namespace, ref)
	be := &Backend{Namespace: ns, Name: string(ref.Name), Weight: 1, FailureMode: poolv1.FailClose}
	if ref.Weight != nil {
		be.Weight = max(int64(*ref.Weight), 0)
	}
	invalid := func(reason, format string, args ...any) *Backend {
		msg := fmt.Sprintf("rule %d backendRef %d: ", ri, bi) + fmt.Sprintf(format, args...)
		be.Invalid = reason + ": " + msg
		b.report("HTTPRoute", r.Namespace, r.Name, reason, "%s", msg)
		return be
	}
	switch {
	case group == InferencePoolGroup && kind == InferencePoolKind:
		be.Kind = BackendInferencePool
	case group == InferencePoolImportGroup && kind == InferencePoolImportKind:
		be.Kind = BackendInferencePoolImport
	default:
		be.Kind = BackendKind(kind)
		return invalid(ReasonInvalidKind, "kind %q of group %q is not routed by mci-sidecar; want %s.%s or %s.%s",
			kind, group, InferencePoolKind, InferencePoolGroup, InferencePoolImportKind, InferencePoolImportGroup)
	}
	key := types.NamespacedName{Namespace: ns, Name: string(ref.Name)}
	if ns != r.Namespace && !b.referenceGranted(r.Namespace, group, kind, key) {
		return invalid(ReasonRefNotPermitted, "%s %s is in another namespace than the route, and no ReferenceGrant of namespace %s allows HTTPRoutes of namespace %s to refer to it", kind, key, ns, r.Namespace)
	}
	be.models = b.models[key]

	var obj metav1.Object
	if be.Kind == BackendInferencePool {
		obj = b.fillPoolBackend(be, key, ra)
		if obj == nil {
			return invalid(ReasonBackendNotFound, "InferencePool %s does not exist", key)
		}
	} else {
		obj = b.fillImportBackend(be, key, ra)
		if obj == nil {
			return invalid(ReasonBackendNotFound, "InferencePoolImport %s does not exist (no other cluster of the ClusterSet exports the pool)", key)
		}
	}

	ra.filter.apply(be, func(reason, format string, args ...any) {
		b.report("HTTPRoute", r.Namespace, r.Name, reason, "rule %d backendRef %d: "+format, append([]any{ri, bi}, args...)...)
	})
	be.Policy = b.backendPolicy(ra.policy, string(be.Kind), obj)

	be.wrr = newClusterRotation(r.Namespace+"/"+r.Name+"#"+strconv.Itoa(ri)+"/"+strconv.Itoa(bi), be.Clusters)
	return be
}

// refTarget is the group, kind and namespace a backendRef names, with
// Gateway API's defaults: the core group, kind Service, the route's
// namespace.
func refTarget(routeNamespace string, ref gatewayv1.BackendRef) (group, kind, namespace string) {
	group, kind, namespace = "", "Service", routeNamespace
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	if ref.Namespace != nil && *ref.Namespace != "" {
		namespace = string(*ref.Namespace)
	}
	return group, kind, namespace
}

// fillPoolBackend sets the clusters and failure mode of a backend that names
// a local InferencePool, and returns the pool (nil when it does not exist).
func (b *builder) fillPoolBackend(be *Backend, key types.NamespacedName, ra routeAnnotations) metav1.Object {
	lr := b.localPool(key)
	if lr.pool == nil {
		return nil
	}
	be.FailureMode = failureMode(lr.pool)
	switch {
	case lr.shim:
		// The pool's EPP is this sidecar: relaying to it would loop.
		be.Shim = true
		b.shimClusters(be, key, lr, ra.weights)
	case lr.cluster != nil:
		c := *lr.cluster
		be.Clusters = []*Cluster{&c}
	}
	return lr.pool
}

// fillImportBackend sets the clusters (the exporters, weighted by the
// route's annotation, and the local pool of the same name when there is
// one) and failure mode of a backend that names an InferencePoolImport, and
// returns the import (nil when it does not exist).
func (b *builder) fillImportBackend(be *Backend, key types.NamespacedName, ra routeAnnotations) metav1.Object {
	imp := b.imports[key]
	if imp == nil {
		return nil
	}
	remote := b.remoteClusters(imp)
	be.Clusters = make([]*Cluster, 0, len(remote))
	for _, c := range remote {
		// Resolved clusters are never modified, so a backend shares them
		// but for the ones the route weighs: an export change copies
		// nothing of the clusters it did not change.
		if w, ok := ra.weights[c.Name]; ok {
			c := *c
			c.Weight *= w
			be.Clusters = append(be.Clusters, &c)
			continue
		}
		be.Clusters = append(be.Clusters, c)
	}
	lr := b.localPool(key)
	if lr.cluster != nil {
		c := *lr.cluster
		be.Local = &c
	}
	switch {
	case ra.failureMode != "":
		be.FailureMode = ra.failureMode
	case lr.pool != nil:
		be.FailureMode = failureMode(lr.pool)
	}
	return imp
}

// backendPolicy is the policy of a backend: the one of the route that
// names it (route, with no Name for none), else the one its pool or import
// obj of kind names, else the default. The one rule of precedence, for
// backendRefs and for shim pools reached without a route.
func (b *builder) backendPolicy(route routingpolicy.Config, kind string, obj metav1.Object) routingpolicy.Config {
	if route.Name != "" {
		return route
	}
	if p := b.policyOf(kind, obj, ""); p.Name != "" {
		return p
	}
	return b.policy
}

// policyOf is the policy PolicyAnnotation names on obj (nil: none), with
// no Name when it names none: the one place the annotation is read and
// parsed. A route's annotation is read; a pool's or an import's
// annotation, else its label (imports carry their exporter's labels; an
// import served by mci-apiserver carries its exporter's configuration in
// canonical form as an annotation too), where an empty value is none. An
// invalid value is reported against obj, with onInvalid appended, and is
// none.
func (b *builder) policyOf(kind string, obj metav1.Object, onInvalid string) routingpolicy.Config {
	var v string
	var ok bool
	if r, route := obj.(*gatewayv1.HTTPRoute); route {
		v, ok = r.Annotations[PolicyAnnotation]
	} else {
		v = objectSetting(obj, PolicyAnnotation)
		ok = v != ""
	}
	if !ok {
		return routingpolicy.Config{}
	}
	p, err := routingpolicy.Parse(v)
	if err != nil {
		b.report(kind, obj.GetNamespace(), obj.GetName(), ReasonInvalidAnnotation, "%s: cluster policy: %v%s", PolicyAnnotation, err, onInvalid)
		return routingpolicy.Config{}
	}
	return p
}

// objectSetting reads a setting from an object's annotations, else from its
// labels (imports carry their exporter's labels, not its annotations).
func objectSetting(obj metav1.Object, key string) string {
	if obj == nil {
		return ""
	}
	if v, ok := obj.GetAnnotations()[key]; ok {
		return v
	}
	return obj.GetLabels()[key]
}
