package imports

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// exportScope is which members an exporter lets import a pool, as its
// ExportToAnnotation says: the members it names, and the members whose
// labels its selector matches. The zero value (no annotation) is the
// whole ClusterSet.
//
// The annotation is a JSON object, as ExportSettingsAnnotation is; the
// exporter's own settings are an annotation of their own because a bad
// scope withdraws the export and bad settings do not (settings.go).
type exportScope struct {
	// limited: the annotation is present. A limited scope with no name and
	// no selector cannot be written: parseExportScope refuses it.
	limited  bool
	clusters []string
	selector labels.Selector
}

// exportTo is the annotation's value as written.
type exportTo struct {
	Clusters []string `json:"clusters,omitempty"`
	// Selector is a label selector in kubectl's syntax ("region=eu",
	// "tier in (gold,silver)"), matched against each member's labels.
	Selector *string `json:"selector,omitempty"`
}

// parseExportScope reads the ExportToAnnotation of a pool. Absent: the
// whole ClusterSet. Present, it must be a JSON object with "clusters" (a
// list of member names) or "selector" (a label selector that is not
// empty) or both, and nothing else: a misspelled field would otherwise
// widen the scope silently, so it makes the export invalid.
func parseExportScope(annotations map[string]string) (exportScope, error) {
	raw, ok := annotations[v1alpha1.ExportToAnnotation]
	if !ok {
		return exportScope{}, nil
	}
	bad := func(format string, a ...any) (exportScope, error) {
		return exportScope{}, fmt.Errorf("annotation %q: %s; write it as %s", v1alpha1.ExportToAnnotation, fmt.Sprintf(format, a...), `{"clusters": ["cluster-b"], "selector": "region=eu"}`)
	}
	var v exportTo
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return bad("not a JSON object with the fields clusters and selector: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("more than one JSON value")
	}
	scope := exportScope{limited: true}
	for _, name := range v.Clusters {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return bad("cluster name %q is not a member name (a DNS subdomain): %s", name, strings.Join(errs, "; "))
		}
		scope.clusters = append(scope.clusters, name)
	}
	slices.Sort(scope.clusters)
	scope.clusters = slices.Compact(scope.clusters)
	if v.Selector != nil {
		if strings.TrimSpace(*v.Selector) == "" {
			return bad("an empty selector selects every member: remove the annotation to export to the whole ClusterSet")
		}
		sel, err := labels.Parse(*v.Selector)
		if err != nil {
			return bad("selector %q: %v", *v.Selector, err)
		}
		scope.selector = sel
	}
	if len(scope.clusters) == 0 && scope.selector == nil {
		return bad("it names no cluster and has no selector")
	}
	return scope, nil
}

// includes says whether a member is in the scope: the whole ClusterSet,
// or a member it names or whose labels its selector matches. A member
// whose labels this server does not know has none: a selector such as
// "region=eu" does not match it (a scope errs on the side of fewer
// members; "!region" does match it, as it matches an unlabelled object).
func (s exportScope) includes(member string, memberLabels map[string]string) bool {
	if !s.limited {
		return true
	}
	if _, found := slices.BinarySearch(s.clusters, member); found {
		return true
	}
	return s.selector != nil && s.selector.Matches(labels.Set(memberLabels))
}

// exportScopeOf is the scope of an export whose annotations ParseExport
// accepted; a scope that does not parse includes nobody (such an export
// is invalid, and reported so, already).
func exportScopeOf(annotations map[string]string) exportScope {
	s, err := parseExportScope(annotations)
	if err != nil {
		return exportScope{limited: true}
	}
	return s
}

// outOfScopeMessage says why a member does not import a pool.
func outOfScopeMessage(member, namespace, name string) string {
	return fmt.Sprintf("cluster %s is outside the scope of %s/%s's export (annotation %s): it neither is named there nor has labels its selector matches", member, namespace, name, v1alpha1.ExportToAnnotation)
}
