package imports

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// SummaryNamespaces is a member's namespaces as its InferenceClusterSummary
// lists them (sorted), seen through a NamespaceLister, so that placement
// reads a member that publishes summaries as it reads one whose Namespaces
// are watched. The namespaces have names only: labels are read of the
// local cluster alone, whose Namespaces are always watched.
type SummaryNamespaces []string

var _ corev1listers.NamespaceLister = SummaryNamespaces(nil)

// List implements corev1listers.NamespaceLister. Only an empty selector
// matches namespaces that carry no labels; any other matches none.
func (s SummaryNamespaces) List(selector labels.Selector) ([]*corev1.Namespace, error) {
	out := make([]*corev1.Namespace, 0, len(s))
	for _, name := range s {
		ns := &corev1.Namespace{}
		ns.Name = name
		if selector.Matches(labels.Set(nil)) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// Get implements corev1listers.NamespaceLister.
func (s SummaryNamespaces) Get(name string) (*corev1.Namespace, error) {
	if _, found := slices.BinarySearch(s, name); !found {
		return nil, apierrors.NewNotFound(corev1.Resource("namespaces"), name)
	}
	ns := &corev1.Namespace{}
	ns.Name = name
	return ns, nil
}
