package requestmodel

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Model is what the EPP does with the requests for one model name, from an
// InferenceModel: how critical they are and which model they are rewritten
// to.
type Model struct {
	// Name is the model name requests carry (spec.modelName).
	Name string
	// Criticality of its requests.
	Criticality scheduling.Criticality
	// Source is the InferenceModel it comes from, "namespace/name".
	Source  string
	targets weighted
}

// Targets returns the target model names, in the InferenceModel's order.
func (m *Model) Targets() []string { return slices.Clone(m.targets.names) }

// TargetModel picks the model a request is rewritten to, with the
// InferenceModel's weights; r supplies the randomness. A model without
// targets is its own target.
func (m *Model) TargetModel(r *rand.Rand) string {
	if len(m.targets.names) == 0 {
		return m.Name
	}
	return m.targets.pick(r)
}

// newModel resolves an InferenceModel. A target without a weight weighs 1
// (the API's documented default); when every weight is 0, which validation
// forbids but a hand-written file may hold, the targets share equally.
func newModel(im *v1alpha2.InferenceModel) *Model {
	m := &Model{Name: im.Spec.ModelName, Criticality: criticality(im.Spec.Criticality), Source: im.Namespace + "/" + im.Name}
	names := make([]string, len(im.Spec.TargetModels))
	weights := make([]int64, len(im.Spec.TargetModels))
	for i, t := range im.Spec.TargetModels {
		names[i], weights[i] = t.Name, 1
		if t.Weight != nil {
			weights[i] = int64(*t.Weight)
		}
	}
	m.targets = newWeighted(names, weights)
	return m
}

// criticality maps the API's criticality; absent means Standard, the API's
// default.
func criticality(c *v1alpha2.Criticality) scheduling.Criticality {
	if c == nil {
		return scheduling.Standard
	}
	switch *c {
	case v1alpha2.Critical:
		return scheduling.Critical
	case v1alpha2.Sheddable:
		return scheduling.Sheddable
	default:
		return scheduling.Standard
	}
}

// weighted is a weighted choice among names: cum holds the cumulative
// weights of the names that can be chosen.
type weighted struct {
	names []string
	cum   []int64
}

// newWeighted keeps the names of positive weight; when none has one, they
// all share equally (what upstream EPPs do when every weight is 0 or unset).
func newWeighted(names []string, weights []int64) weighted {
	var w weighted
	var total int64
	for i, n := range names {
		if weights[i] <= 0 {
			continue
		}
		total += weights[i]
		w.names = append(w.names, n)
		w.cum = append(w.cum, total)
	}
	if total == 0 {
		w.names = slices.Clone(names)
		w.cum = make([]int64, len(names))
		for i := range names {
			w.cum[i] = int64(i + 1)
		}
	}
	return w
}

// pick chooses a name by weight; "" when there is none.
func (w weighted) pick(r *rand.Rand) string {
	switch len(w.names) {
	case 0:
		return ""
	case 1:
		return w.names[0]
	}
	n := r.Int64N(w.cum[len(w.cum)-1])
	i, _ := slices.BinarySearch(w.cum, n+1)
	return w.names[i]
}

// ModelConfig is every object that says what the EPP does with the requests
// of its pool. Objectives and Rewrites of the llm-d.ai group are converted
// with ObjectiveFromLLMD and RewriteFromLLMD first.
type ModelConfig struct {
	Models     []*v1alpha2.InferenceModel
	Objectives []*v1alpha2.InferenceObjective
	Rewrites   []*v1alpha2.InferenceModelRewrite
}

// Models holds a pool's request configuration: its InferenceModels by model
// name, its InferenceObjectives by name and its InferenceModelRewrite rules
// by the model they match. Reads are lock-free; Set swaps in a new state.
// Safe for concurrent use.
type Models struct {
	state  atomic.Pointer[modelState]
	served atomic.Pointer[map[schema.GroupVersionResource]bool]
}

type modelState struct {
	byName     map[string]*Model
	objectives map[string]*Objective
	rewrites   rewriteIndex
}

// NewModels returns an empty set.
func NewModels() *Models {
	s := &Models{}
	s.state.Store(&modelState{byName: map[string]*Model{}, objectives: map[string]*Objective{}})
	return s
}

// Set replaces the configuration. Conflicts are resolved as upstream
// resolves them, and Set returns what it ignored or repaired so that the
// caller can report it:
//   - Several InferenceModels with one model name: the oldest
//     (creationTimestamp, then namespace/name) wins.
//   - Several InferenceObjectives with one name (requests name objectives by
//     name only): llm-d.ai/v1alpha2 wins over inference.networking.x-k8s.io,
//     the group GIE v1.6 moved them out of; then the oldest.
//   - InferenceModelRewrite rules: see rewriteIndex.
func (s *Models) Set(c ModelConfig) (ignored []string) {
	st := &modelState{
		byName:     make(map[string]*Model, len(c.Models)),
		objectives: make(map[string]*Objective, len(c.Objectives)),
	}
	models := slices.Clone(c.Models)
	slices.SortStableFunc(models, func(a, b *v1alpha2.InferenceModel) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time), strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name))
	})
	for _, im := range models {
		if old, ok := st.byName[im.Spec.ModelName]; ok {
			ignored = append(ignored, fmt.Sprintf("InferenceModel %s/%s (model %q is already served by the older %s)", im.Namespace, im.Name, im.Spec.ModelName, old.Source))
			continue
		}
		st.byName[im.Spec.ModelName] = newModel(im)
	}

	objectives := slices.Clone(c.Objectives)
	slices.SortStableFunc(objectives, func(a, b *v1alpha2.InferenceObjective) int {
		return cmp.Or(-cmp.Compare(groupRank(a.APIVersion), groupRank(b.APIVersion)),
			a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time),
			strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name))
	})
	for _, o := range objectives {
		obj := newObjective(o)
		if old, ok := st.objectives[o.Name]; ok {
			ignored = append(ignored, fmt.Sprintf("%s (objective %q is already defined by %s)", obj.Source, o.Name, old.Source))
			continue
		}
		st.objectives[o.Name] = obj
	}

	var notes []string
	st.rewrites, notes = newRewriteIndex(c.Rewrites)
	ignored = append(ignored, notes...)
	s.state.Store(st)
	return ignored
}

// Get returns the model for a name, nil when no InferenceModel has it.
func (s *Models) Get(name string) *Model {
	return s.state.Load().byName[name]
}

// Objective returns the InferenceObjective of a name, nil when there is
// none.
func (s *Models) Objective(name string) *Objective {
	return s.state.Load().objectives[name]
}

// Len returns how many model names are known.
func (s *Models) Len() int {
	return len(s.state.Load().byName)
}

// Counts returns how many InferenceModels, InferenceObjectives and
// InferenceModelRewrite rules are in use.
func (s *Models) Counts() (models, objectives, rewriteRules int) {
	st := s.state.Load()
	return len(st.byName), len(st.objectives), st.rewrites.rules
}

// SetServedAPIs records which model configuration resources the pool's
// cluster serves (KubeSource); the metrics report it.
func (s *Models) SetServedAPIs(served map[schema.GroupVersionResource]bool) {
	s.served.Store(&served)
}

// ServedAPIs returns what SetServedAPIs recorded, nil in standalone mode.
func (s *Models) ServedAPIs() map[schema.GroupVersionResource]bool {
	if p := s.served.Load(); p != nil {
		return *p
	}
	return nil
}
