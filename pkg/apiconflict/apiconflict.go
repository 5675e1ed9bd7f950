// Package apiconflict finds what else in a cluster claims the group version
// mci-apiserver serves. The Gateway API Inference Extension ships an
// InferencePoolImport CRD in inference.networking.x-k8s.io/v1alpha1, the
// group version that mci's APIService registers. kube-apiserver keeps one
// APIService per group version: the CRD's is managed by kube-apiserver
// itself, and whichever of the two the aggregator holds decides who answers
// `kubectl get inferencepoolimports`. Nothing fails loudly when both exist,
// so mci-apiserver looks at start and says which one serves.
package apiconflict

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

var (
	crdGVR        = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
)

// Who serves the group version, as the APIService says.
const (
	// ServedByMCI: the APIService names a Service (mci-apiserver's).
	ServedByMCI = "mci-apiserver"
	// ServedLocally: the APIService names no Service, so kube-apiserver
	// answers from its CRDs; mci-apiserver gets no request.
	ServedLocally = "kube-apiserver"
	// ServedByNobody: no APIService exists for the group version yet.
	ServedByNobody = "none"
)

// Finding is what Check saw.
type Finding struct {
	// CRDs are the CustomResourceDefinitions that serve resources in the
	// group version, by name.
	CRDs []string
	// ServedBy is who the APIService sends the group version to.
	ServedBy string
	// Service is the namespace/name the APIService names, if any.
	Service string
}

// Conflict says whether a CRD and mci claim the same group version.
func (f Finding) Conflict() bool { return len(f.CRDs) > 0 }

// Describe says in one sentence what a user of the cluster sees.
func (f Finding) Describe(gv schema.GroupVersion) string {
	if !f.Conflict() {
		return fmt.Sprintf("no CRD serves %s", gv)
	}
	crds := strings.Join(f.CRDs, ", ")
	switch f.ServedBy {
	case ServedByMCI:
		return fmt.Sprintf("CRD %s also defines %s, but the APIService sends it to %s: clients see mci's computed imports, and the CRD's stored objects are hidden until the APIService is removed", crds, gv, f.Service)
	case ServedLocally:
		return fmt.Sprintf("CRD %s serves %s and the APIService points at kube-apiserver itself: clients see the CRD's stored objects and none of mci's computed imports; apply mci's APIService (which names its Service) to serve mci's", crds, gv)
	default:
		return fmt.Sprintf("CRD %s defines %s and no APIService is registered yet", crds, gv)
	}
}

// Check looks up the CRDs that would serve the given resources of gv (a
// CRD's name is <resource>.<group>, so a GET by name finds each one and
// needs no permission to list every CRD of the cluster) and the
// APIService that routes gv.
func Check(ctx context.Context, client dynamic.Interface, gv schema.GroupVersion, resources []string) (Finding, error) {
	var f Finding
	for _, r := range resources {
		name := r + "." + gv.Group
		crd, err := client.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return f, fmt.Errorf("reading CustomResourceDefinition %s: %w", name, err)
		}
		if servesVersion(crd, gv) {
			f.CRDs = append(f.CRDs, name)
		}
	}
	sort.Strings(f.CRDs)

	svc, err := client.Resource(apiServiceGVR).Get(ctx, gv.Version+"."+gv.Group, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		f.ServedBy = ServedByNobody
	case err != nil:
		return f, fmt.Errorf("reading APIService %s.%s: %w", gv.Version, gv.Group, err)
	default:
		ns, _, _ := unstructured.NestedString(svc.Object, "spec", "service", "namespace")
		name, _, _ := unstructured.NestedString(svc.Object, "spec", "service", "name")
		if name == "" {
			f.ServedBy = ServedLocally
		} else {
			f.ServedBy, f.Service = ServedByMCI, ns+"/"+name
		}
	}
	return f, nil
}

// servesVersion says whether a CRD object serves gv. Malformed CRDs (a
// field of the wrong type) serve nothing.
func servesVersion(crd *unstructured.Unstructured, gv schema.GroupVersion) bool {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	if group != gv.Group {
		return false
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m, ok := v.(map[string]interface{})
		if !ok {
			continue
		}
		if name, _ := m["name"].(string); name != gv.Version {
			continue
		}
		if served, _ := m["served"].(bool); served {
			return true
		}
	}
	return false
}

var conflictingCRDs = metrics.NewGaugeVec(&metrics.GaugeOpts{
	Name:           "mci_apiserver_conflicting_crds",
	Help:           "CustomResourceDefinitions of the local cluster that serve resources in the group version mci-apiserver serves, as found at start, by who the APIService sends that group version to (served_by: mci-apiserver, kube-apiserver, none). With served_by=kube-apiserver, clients see the CRD's objects and none of mci's.",
	StabilityLevel: metrics.ALPHA,
}, []string{"served_by"})

func init() {
	legacyregistry.MustRegister(conflictingCRDs)
}

// Report checks once and says what it found: a log line (a warning when a
// CRD claims the group version) and the conflicting-CRDs gauge. A failed
// check is logged and leaves the gauge unset: mci-apiserver needs no
// permission on CRDs to serve, only to say this.
func Report(ctx context.Context, client dynamic.Interface, gv schema.GroupVersion, resources []string) {
	logger := klog.FromContext(ctx)
	f, err := Check(ctx, client, gv, resources)
	if err != nil {
		logger.Error(err, "Cannot tell whether a CRD also serves the group version; the conflicting-CRDs metric stays unset", "groupVersion", gv.String())
		return
	}
	for _, by := range []string{ServedByMCI, ServedLocally, ServedByNobody} {
		n := 0
		if by == f.ServedBy {
			n = len(f.CRDs)
		}
		conflictingCRDs.WithLabelValues(by).Set(float64(n))
	}
	if f.Conflict() {
		logger.Info("WARNING: a CRD claims the group version this server serves", "groupVersion", gv.String(), "crds", f.CRDs, "servedBy", f.ServedBy, "effect", f.Describe(gv))
		return
	}
	logger.V(2).Info("No CRD claims the group version this server serves", "groupVersion", gv.String(), "servedBy", f.ServedBy)
}
