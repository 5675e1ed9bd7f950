package conformance

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The upstream InferencePoolImport (Gateway API Inference Extension,
// apix/v1alpha1), written from its published type and CRD markers: the
// JSON names and the fields a typed client reads. Decoding is not strict,
// as a typed client's is not: an implementation may serve more.
type upstreamImport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is required and empty.
	Spec   *struct{} `json:"spec"`
	Status struct {
		// Controllers is required: listType=map keyed by name, at most 8.
		Controllers []upstreamController `json:"controllers"`
	} `json:"status"`
}

type upstreamController struct {
	Name              string                     `json:"name"`
	ExportingClusters []upstreamExportingCluster `json:"exportingClusters,omitempty"`
	Parents           []upstreamParentStatus     `json:"parents,omitempty"`
	Conditions        []metav1.Condition         `json:"conditions,omitempty"`
}

type upstreamExportingCluster struct {
	Name string `json:"name"`
}

// upstreamParentStatus is the ParentStatus of the upstream InferencePool
// (api/v1), which InferencePoolImport's parents reuse.
type upstreamParentStatus struct {
	ParentRef      upstreamParentReference `json:"parentRef"`
	ControllerName string                  `json:"controllerName,omitempty"`
	Conditions     []metav1.Condition      `json:"conditions,omitempty"`
}

type upstreamParentReference struct {
	Group     *string `json:"group,omitempty"`
	Kind      string  `json:"kind,omitempty"`
	Name      string  `json:"name"`
	Namespace string  `json:"namespace,omitempty"`
}

// The validation of the upstream CRD's schema for the fields it constrains.
var (
	// ControllerName: DOMAIN "/" PATH, 1 to 253 characters.
	controllerNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$`)
	// metav1.Condition's type and reason.
	conditionTypePattern   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$`)
	conditionReasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)
	// Gateway API's Kind and Group of a ParentReference.
	kindPattern  = regexp.MustCompile(`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)
	groupPattern = regexp.MustCompile(`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// checkUpstreamShape decodes one served import (a GET's body or a watch
// event's object) as a client of the upstream type does and checks it
// against the upstream schema; it returns every problem found.
func checkUpstreamShape(raw []byte) (problems []string) {
	var imp upstreamImport
	if err := json.Unmarshal(raw, &imp); err != nil {
		return []string{"does not decode into the upstream InferencePoolImport: " + err.Error()}
	}
	where := imp.Namespace + "/" + imp.Name
	bad := func(format string, args ...any) { problems = append(problems, where+": "+fmt.Sprintf(format, args...)) }
	if imp.APIVersion != importsGVR.GroupVersion().String() || imp.Kind != "InferencePoolImport" {
		bad("apiVersion %q and kind %q, want %s InferencePoolImport", imp.APIVersion, imp.Kind, importsGVR.GroupVersion())
	}
	if imp.Name == "" || imp.Namespace == "" {
		bad("metadata.name and metadata.namespace are required")
	}
	if imp.Spec == nil {
		bad("spec is required")
	}
	if n := len(imp.Status.Controllers); n == 0 || n > 8 {
		bad("status.controllers is required, with 1 to 8 entries: has %d", n)
	}
	var seen []string
	for i, c := range imp.Status.Controllers {
		at := fmt.Sprintf("status.controllers[%d]", i)
		if len(c.Name) > 253 || !controllerNamePattern.MatchString(c.Name) {
			bad("%s.name %q is not a ControllerName (DOMAIN/PATH, at most 253 characters)", at, c.Name)
		}
		if slices.Contains(seen, c.Name) {
			bad("%s.name %q is not unique (status.controllers is a map keyed by name)", at, c.Name)
		}
		seen = append(seen, c.Name)
		var clusters []string
		for j, e := range c.ExportingClusters {
			if e.Name == "" || slices.Contains(clusters, e.Name) {
				bad("%s.exportingClusters[%d].name %q must be set and unique", at, j, e.Name)
			}
			clusters = append(clusters, e.Name)
		}
		checkConditions(bad, at+".conditions", c.Conditions)
		for j, p := range c.Parents {
			pat := fmt.Sprintf("%s.parents[%d]", at, j)
			if n := len(p.ParentRef.Name); n == 0 || n > 253 {
				bad("%s.parentRef.name %q must have 1 to 253 characters", pat, p.ParentRef.Name)
			}
			if p.ParentRef.Kind != "" && (len(p.ParentRef.Kind) > 63 || !kindPattern.MatchString(p.ParentRef.Kind)) {
				bad("%s.parentRef.kind %q is not a Kind", pat, p.ParentRef.Kind)
			}
			if g := p.ParentRef.Group; g != nil && (len(*g) > 253 || !groupPattern.MatchString(*g)) {
				bad("%s.parentRef.group %q is not a Group", pat, *g)
			}
			if p.ControllerName != "" && (len(p.ControllerName) > 253 || !controllerNamePattern.MatchString(p.ControllerName)) {
				bad("%s.controllerName %q is not a ControllerName", pat, p.ControllerName)
			}
			checkConditions(bad, pat+".conditions", p.Conditions)
		}
	}
	return problems
}

// checkConditions applies metav1.Condition's schema and the upstream list
// rules (a map keyed by type, at most 8 entries).
func checkConditions(bad func(string, ...any), at string, conds []metav1.Condition) {
	if len(conds) > 8 {
		bad("%s has %d entries, at most 8", at, len(conds))
	}
	var types []string
	for k, c := range conds {
		if len(c.Type) > 316 || !conditionTypePattern.MatchString(c.Type) || slices.Contains(types, c.Type) {
			bad("%s[%d].type %q must be a valid, unique condition type", at, k, c.Type)
		}
		types = append(types, c.Type)
		if c.Status != metav1.ConditionTrue && c.Status != metav1.ConditionFalse && c.Status != metav1.ConditionUnknown {
			bad("%s[%d].status %q is not True, False or Unknown", at, k, c.Status)
		}
		if len(c.Reason) > 1024 || !conditionReasonPattern.MatchString(c.Reason) {
			bad("%s[%d].reason %q is not a CamelCase reason", at, k, c.Reason)
		}
		if len(c.Message) > 32768 {
			bad("%s[%d].message has %d characters, at most 32768", at, k, len(c.Message))
		}
		if c.LastTransitionTime.IsZero() {
			bad("%s[%d].lastTransitionTime is required", at, k)
		}
		if c.ObservedGeneration < 0 {
			bad("%s[%d].observedGeneration is negative", at, k)
		}
	}
}

// decodeUpstream decodes an unstructured import into the upstream shape;
// the zero import when it does not decode (checkUpstreamShape says why).
func decodeUpstream(obj *unstructured.Unstructured) upstreamImport {
	var imp upstreamImport
	if raw, err := obj.MarshalJSON(); err == nil {
		_ = json.Unmarshal(raw, &imp)
	}
	return imp
}

// exportingClusters are the names of the exporting clusters an import
// lists, over all its controllers, sorted and without repeats.
func exportingClusters(obj *unstructured.Unstructured) []string {
	var out []string
	for _, c := range decodeUpstream(obj).Status.Controllers {
		for _, e := range c.ExportingClusters {
			if !slices.Contains(out, e.Name) {
				out = append(out, e.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

func controllerNames(obj *unstructured.Unstructured) []string {
	var out []string
	for _, c := range decodeUpstream(obj).Status.Controllers {
		out = append(out, c.Name)
	}
	return out
}
