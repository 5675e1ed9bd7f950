package requestmodel

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// The request headers of the Endpoint Picker protocol that steer a
// request. The llm-d router (which owns InferenceObjective and
// InferenceModelRewrite since GIE v1.6) renamed them x-llm-d-*; it still reads
// the x-gateway-* names of GIE, and so does mci, the llm-d name first when a
// request carries both.
const (
	// ObjectiveHeader names the InferenceObjective of a request (its
	// metadata.name, in the pool's namespace).
	ObjectiveHeader     = "x-gateway-inference-objective"
	LLMDObjectiveHeader = "x-llm-d-inference-objective"
	// FairnessIDHeader groups requests into flows for fairness between
	// requests of one priority (upstream flow control).
	FairnessIDHeader     = "x-gateway-inference-fairness-id"
	LLMDFairnessIDHeader = "x-llm-d-inference-fairness-id"
	// ModelNameRewriteHeader asks for the model the body is rewritten to,
	// unless an InferenceModelRewrite rule (or InferenceModel) of the
	// requested model decides otherwise.
	ModelNameRewriteHeader     = "x-gateway-model-name-rewrite"
	LLMDModelNameRewriteHeader = "x-llm-d-model-name-rewrite"
)

// DefaultFairnessID is the flow of a request without a fairness ID, as
// upstream names it.
const DefaultFairnessID = "default-flow"

// RequestHeaders are the steering headers of one request, read with
// ReadRequestHeaders.
type RequestHeaders struct {
	Objective, FairnessID, ModelNameRewrite string
}

// ReadRequestHeaders reads the steering headers through get, which returns
// a header's first value ("" when absent) by lower-case name.
func ReadRequestHeaders(get func(name string) string) RequestHeaders {
	first := func(names ...string) string {
		for _, n := range names {
			if v := get(n); v != "" {
				return v
			}
		}
		return ""
	}
	return RequestHeaders{
		Objective:        first(LLMDObjectiveHeader, ObjectiveHeader),
		FairnessID:       first(LLMDFairnessIDHeader, FairnessIDHeader),
		ModelNameRewrite: first(LLMDModelNameRewriteHeader, ModelNameRewriteHeader),
	}
}

// Objective is a resolved InferenceObjective.
type Objective struct {
	// Name is what requests put in the objective header.
	Name string
	// Priority is spec.priority, 0 when unset (as upstream EPPs take it).
	Priority int32
	// Source names the object: "<group> InferenceObjective namespace/name".
	Source string
}

// Criticality maps the priority onto the filter chain: below 0 is
// sheddable (upstream EPPs shed only priority < 0 under saturation), 0 is
// Standard and above 0 Critical (both take the critical path; the chain has
// no finer bands).
func (o *Objective) Criticality() scheduling.Criticality {
	return PriorityCriticality(o.Priority)
}

// PriorityCriticality is the criticality of a priority.
func PriorityCriticality(p int32) scheduling.Criticality {
	switch {
	case p < 0:
		return scheduling.Sheddable
	case p > 0:
		return scheduling.Critical
	default:
		return scheduling.Standard
	}
}

func newObjective(o *v1alpha2.InferenceObjective) *Objective {
	obj := &Objective{Name: o.Name, Source: source(o.APIVersion, "InferenceObjective", o.ObjectMeta)}
	if o.Spec.Priority != nil {
		obj.Priority = *o.Spec.Priority
	}
	return obj
}

// source names an object in logs and notes.
func source(apiVersion, kind string, m metav1.ObjectMeta) string {
	group := v1alpha2.SchemeGroupVersion.Group
	if apiVersion == llmdv1alpha2.SchemeGroupVersion.String() {
		group = llmdv1alpha2.SchemeGroupVersion.Group
	}
	return fmt.Sprintf("%s %s/%s (%s)", kind, m.Namespace, m.Name, group)
}

// groupRank orders the two groups: llm-d.ai, where the objects live now,
// before inference.networking.x-k8s.io.
func groupRank(apiVersion string) int {
	if apiVersion == llmdv1alpha2.SchemeGroupVersion.String() {
		return 1
	}
	return 0
}

// ObjectiveFromLLMD converts an llm-d.ai InferenceObjective (same shape) to
// the form Models reads; the apiVersion it keeps says where it comes from.
func ObjectiveFromLLMD(o *llmdv1alpha2.InferenceObjective) *v1alpha2.InferenceObjective {
	return &v1alpha2.InferenceObjective{
		TypeMeta:   metav1.TypeMeta{APIVersion: llmdv1alpha2.SchemeGroupVersion.String(), Kind: "InferenceObjective"},
		ObjectMeta: o.ObjectMeta,
		Spec:       o.Spec,
		Status:     o.Status,
	}
}

// RewriteFromLLMD converts an llm-d.ai InferenceModelRewrite likewise.
func RewriteFromLLMD(r *llmdv1alpha2.InferenceModelRewrite) *v1alpha2.InferenceModelRewrite {
	return &v1alpha2.InferenceModelRewrite{
		TypeMeta:   metav1.TypeMeta{APIVersion: llmdv1alpha2.SchemeGroupVersion.String(), Kind: "InferenceModelRewrite"},
		ObjectMeta: r.ObjectMeta,
		Spec:       r.Spec,
		Status:     r.Status,
	}
}

// rewriteRule is one InferenceModelRewrite rule, resolved.
type rewriteRule struct {
	// source names the rewrite and the rule's index.
	source  string
	targets weighted
}

// rewriteIndex finds the rule that applies to a model, with upstream's
// precedence: a rule that matches the model exactly wins over a rule
// without matches (a generic rule, which matches every model); among rules
// of one kind the oldest InferenceModelRewrite (creationTimestamp) wins, then
// (mci's tie break, where upstream leaves it open) the llm-d.ai group, then
// namespace/name; within one rewrite the first rule in the list wins.
type rewriteIndex struct {
	exact   map[string]*rewriteRule
	generic *rewriteRule
	rules   int
}

// newRewriteIndex indexes the rules; notes say what was repaired or
// shadowed.
func newRewriteIndex(rewrites []*v1alpha2.InferenceModelRewrite) (rewriteIndex, []string) {
	sorted := slices.Clone(rewrites)
	slices.SortStableFunc(sorted, func(a, b *v1alpha2.InferenceModelRewrite) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time),
			-cmp.Compare(groupRank(a.APIVersion), groupRank(b.APIVersion)),
			strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name))
	})
	idx := rewriteIndex{exact: map[string]*rewriteRule{}}
	var notes []string
	for _, rw := range sorted {
		src := source(rw.APIVersion, "InferenceModelRewrite", rw.ObjectMeta)
		for i, r := range rw.Spec.Rules {
			rule := &rewriteRule{source: fmt.Sprintf("%s rule %d", src, i)}
			names := make([]string, len(r.Targets))
			weights := make([]int64, len(r.Targets))
			set := 0
			for j, t := range r.Targets {
				names[j] = t.ModelRewrite
				if t.Weight != nil {
					weights[j] = int64(*t.Weight)
					set++
				}
			}
			if set > 0 && set < len(r.Targets) {
				// What the llm-d router does: a target without a weight is
				// never chosen. The API asks for weights on all or none.
				notes = append(notes, fmt.Sprintf("%s: only %d of %d targets have a weight; the others are never chosen", rule.source, set, len(r.Targets)))
			}
			rule.targets = newWeighted(names, weights)
			idx.rules++
			if len(r.Matches) == 0 {
				if idx.generic == nil {
					idx.generic = rule
				} else {
					notes = append(notes, fmt.Sprintf("%s matches every model and is shadowed by the older %s", rule.source, idx.generic.source))
				}
				continue
			}
			for _, m := range r.Matches {
				if m.Model == nil {
					continue
				}
				if old, ok := idx.exact[m.Model.Value]; ok {
					if old != rule {
						notes = append(notes, fmt.Sprintf("%s: model %q is already rewritten by the older %s", rule.source, m.Model.Value, old.source))
					}
					continue
				}
				idx.exact[m.Model.Value] = rule
			}
		}
	}
	return idx, notes
}

// Criticality is the criticality Resolve gives a request for model that
// names objective ("" for none), without choosing a target model.
func (s *Models) Criticality(model, objective string) scheduling.Criticality {
	st := s.state.Load()
	c, _, _ := st.criticality(st.byName[model], objective)
	return c
}

// criticality: the named objective's, else the InferenceModel's (m, nil
// when there is none), else Standard. It also returns the objective, or
// the name of an unknown one.
func (st *modelState) criticality(m *Model, objective string) (scheduling.Criticality, *Objective, string) {
	if objective != "" {
		if o := st.objectives[objective]; o != nil {
			return o.Criticality(), o, ""
		}
	}
	c := scheduling.Standard
	if m != nil {
		c = m.Criticality
	}
	if objective != "" {
		return c, nil, objective
	}
	return c, nil, ""
}

// Resolution is what the pool's configuration makes of one request.
type Resolution struct {
	// Criticality of the request.
	Criticality scheduling.Criticality
	// Objective is the InferenceObjective the request named, nil when it
	// named none or one that does not exist.
	Objective *Objective
	// UnknownObjective is the objective the request named that does not
	// exist ("" when none): it is served as if it named none.
	UnknownObjective string
	// Listed is whether the model is named by an InferenceModel or an
	// InferenceModelRewrite rule that matches it exactly.
	Listed bool
	// TargetModel is the model the request is sent for.
	TargetModel string
	// RewrittenBy says what chose TargetModel: an InferenceModelRewrite
	// rule, an InferenceModel, the model name rewrite header, or "" when the
	// model goes as requested.
	RewrittenBy string
}

// RewrittenByHeader is Resolution.RewrittenBy for the model name rewrite
// header.
const RewrittenByHeader = "header"

// Resolve decides the criticality and target model of a request for model
// with headers h; r supplies the randomness of weighted targets.
//
// Criticality: the named InferenceObjective's priority, when the request
// names one that exists; else the InferenceModel's criticality; else
// Standard (priority 0, upstream's default).
//
// Target model, first that applies: an InferenceModelRewrite rule that
// matches the model exactly; an InferenceModel of the model with
// targetModels (it names the model exactly too, and ranks after the newer
// API); an InferenceModelRewrite rule without matches; the model name
// rewrite header; the model as requested. Upstream EPPs apply a matching
// rule over the header in the same way.
func (s *Models) Resolve(model string, h RequestHeaders, r *rand.Rand) Resolution {
	st := s.state.Load()
	res := Resolution{TargetModel: model}
	m := st.byName[model]
	res.Listed = m != nil
	res.Criticality, res.Objective, res.UnknownObjective = st.criticality(m, h.Objective)
	rule := st.rewrites.exact[model]
	if rule != nil {
		res.Listed = true
	}
	switch {
	case rule != nil:
	case m != nil && len(m.targets.names) > 0:
		res.TargetModel, res.RewrittenBy = m.TargetModel(r), "InferenceModel "+m.Source
		return res
	case st.rewrites.generic != nil:
		rule = st.rewrites.generic
	case h.ModelNameRewrite != "":
		res.TargetModel, res.RewrittenBy = h.ModelNameRewrite, RewrittenByHeader
		return res
	default:
		return res
	}
	// A matching rule without targets leaves the model as requested.
	if t := rule.targets.pick(r); t != "" {
		res.TargetModel, res.RewrittenBy = t, rule.source
	}
	return res
}
