package requestmodel

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/requestmodel/requestmodeltest"
	"github.com/mci-dev/mci/pkg/scheduling"
)

func at(day int) metav1.Time { return metav1.NewTime(time.Date(2026, 1, day, 0, 0, 0, 0, time.UTC)) }

func aged[T interface{ SetCreationTimestamp(metav1.Time) }](o T, day int) T {
	o.SetCreationTimestamp(at(day))
	return o
}

// TestResolve follows the upstream documents: InferenceObjective's priority
// ("requests with Priority 10 will always be served before requests with
// Priority of 0 (the value used if Priority is unset or no
// InferenceObjective is specified)"; the EPP sheds priority < 0 under
// saturation) and InferenceModelRewrite's precedence ("Exact" before a rule
// without matches, then the oldest resource, then the first rule), with
// mci's place for InferenceModel in between.
func TestResolve(t *testing.T) {
	tests := []struct {
		name    string
		config  ModelConfig
		model   string
		headers RequestHeaders

		wantCrit        scheduling.Criticality
		wantObjective   string
		wantUnknown     string
		wantTarget      string
		wantRewrittenBy string
		wantListed      bool
	}{
		{
			name:     "no objective named: priority 0, Standard",
			config:   ModelConfig{Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("batch", ptr.To[int32](-1))}},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "m",
		},
		{
			name:   "an objective of priority below 0 is sheddable",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("batch", ptr.To[int32](-1))}},
			model:  "m", headers: RequestHeaders{Objective: "batch"},
			wantCrit: scheduling.Sheddable, wantObjective: "batch", wantTarget: "m",
		},
		{
			name:   "an objective of priority 0 is Standard",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("normal", ptr.To[int32](0))}},
			model:  "m", headers: RequestHeaders{Objective: "normal"},
			wantCrit: scheduling.Standard, wantObjective: "normal", wantTarget: "m",
		},
		{
			name:   "an objective without a priority counts as priority 0",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("unset", nil)}},
			model:  "m", headers: RequestHeaders{Objective: "unset"},
			wantCrit: scheduling.Standard, wantObjective: "unset", wantTarget: "m",
		},
		{
			name:   "an objective of priority above 0 is Critical",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("chat", ptr.To[int32](10))}},
			model:  "m", headers: RequestHeaders{Objective: "chat"},
			wantCrit: scheduling.Critical, wantObjective: "chat", wantTarget: "m",
		},
		{
			name:   "an llm-d.ai objective is read like the other group's",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{ObjectiveFromLLMD(requestmodeltest.LLMDObjective("batch", -3))}},
			model:  "m", headers: RequestHeaders{Objective: "batch"},
			wantCrit: scheduling.Sheddable, wantObjective: "batch", wantTarget: "m",
		},
		{
			name: "one objective name in both groups: llm-d.ai wins, even when younger",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{
				aged(requestmodeltest.Objective("batch", ptr.To[int32](5)), 1), aged(ObjectiveFromLLMD(requestmodeltest.LLMDObjective("batch", -1)), 2),
			}},
			model: "m", headers: RequestHeaders{Objective: "batch"},
			wantCrit: scheduling.Sheddable, wantObjective: "batch", wantTarget: "m",
		},
		{
			name:   "an unknown objective is served with priority 0, as if the request named none",
			config: ModelConfig{Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("batch", ptr.To[int32](-1))}},
			model:  "m", headers: RequestHeaders{Objective: "bacth"},
			wantCrit: scheduling.Standard, wantUnknown: "bacth", wantTarget: "m",
		},
		{
			name: "the named objective wins over the InferenceModel's criticality",
			config: ModelConfig{
				Models:     []*v1alpha2.InferenceModel{requestmodeltest.InferenceModel("m", "m", ptr.To(v1alpha2.Critical))},
				Objectives: []*v1alpha2.InferenceObjective{requestmodeltest.Objective("batch", ptr.To[int32](-1))},
			},
			model: "m", headers: RequestHeaders{Objective: "batch"},
			wantCrit: scheduling.Sheddable, wantObjective: "batch", wantTarget: "m", wantListed: true,
		},
		{
			name:   "without an objective the InferenceModel's criticality applies",
			config: ModelConfig{Models: []*v1alpha2.InferenceModel{requestmodeltest.InferenceModel("m", "m", ptr.To(v1alpha2.Sheddable))}},
			model:  "m", headers: RequestHeaders{Objective: "missing"},
			wantCrit: scheduling.Sheddable, wantUnknown: "missing", wantTarget: "m", wantListed: true,
		},
		{
			name:     "an exact rule rewrites the model it matches",
			config:   ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"food-review"}, requestmodeltest.RewriteTarget("food-review-v1", nil)))}},
			model:    "food-review",
			wantCrit: scheduling.Standard, wantTarget: "food-review-v1", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name:     "a rule matches when any of its matches does",
			config:   ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"a", "b"}, requestmodeltest.RewriteTarget("c", nil)))}},
			model:    "b",
			wantCrit: scheduling.Standard, wantTarget: "c", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name:     "matching is exact: another model is not rewritten",
			config:   ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"food-review"}, requestmodeltest.RewriteTarget("food-review-v1", nil)))}},
			model:    "Food-Review",
			wantCrit: scheduling.Standard, wantTarget: "Food-Review",
		},
		{
			name: "an exact rule wins over a generic rule, even an older one",
			config: ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{
				aged(requestmodeltest.Rewrite("generic", requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("everything", nil))), 1),
				aged(requestmodeltest.Rewrite("exact", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("m-v2", nil))), 2),
			}},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "m-v2", wantRewrittenBy: "InferenceModelRewrite default/exact (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name: "between two exact rules of different rewrites, the oldest rewrite wins",
			config: ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{
				aged(requestmodeltest.Rewrite("newer", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("from-newer", nil))), 3),
				aged(requestmodeltest.Rewrite("older", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("from-older", nil))), 2),
			}},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "from-older", wantRewrittenBy: "InferenceModelRewrite default/older (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name: "within one rewrite the first matching rule wins",
			config: ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{
				requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("first", nil)), requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("second", nil))),
			}},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "first", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name:     "a generic rule rewrites every model no exact rule matches",
			config:   ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("default-model", nil)))}},
			model:    "anything",
			wantCrit: scheduling.Standard, wantTarget: "default-model", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0",
		},
		{
			name: "an llm-d.ai rewrite is read like the other group's",
			config: ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{RewriteFromLLMD(&llmdv1alpha2.InferenceModelRewrite{
				ObjectMeta: metav1.ObjectMeta{Name: "rw", Namespace: "default"},
				Spec:       requestmodeltest.Rewrite("", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("m-llmd", nil))).Spec,
			})}},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "m-llmd", wantRewrittenBy: "InferenceModelRewrite default/rw (llm-d.ai) rule 0", wantListed: true,
		},
		{
			name: "an exact rule wins over an InferenceModel's targetModels",
			config: ModelConfig{
				Models:   []*v1alpha2.InferenceModel{requestmodeltest.InferenceModel("im", "m", ptr.To(v1alpha2.Critical), requestmodeltest.Target("from-inference-model", nil))},
				Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("from-rewrite", nil)))},
			},
			model:    "m",
			wantCrit: scheduling.Critical, wantTarget: "from-rewrite", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name: "an InferenceModel's targetModels win over a generic rule (the InferenceModel names the model exactly)",
			config: ModelConfig{
				Models:   []*v1alpha2.InferenceModel{requestmodeltest.InferenceModel("im", "m", nil, requestmodeltest.Target("from-inference-model", nil))},
				Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("from-generic", nil)))},
			},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "from-inference-model", wantRewrittenBy: "InferenceModel default/im", wantListed: true,
		},
		{
			name: "an InferenceModel without targetModels leaves the model to a generic rule",
			config: ModelConfig{
				Models:   []*v1alpha2.InferenceModel{requestmodeltest.InferenceModel("im", "m", ptr.To(v1alpha2.Sheddable))},
				Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("from-generic", nil)))},
			},
			model:    "m",
			wantCrit: scheduling.Sheddable, wantTarget: "from-generic", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0", wantListed: true,
		},
		{
			name:  "the model name rewrite header sets the target when nothing else does",
			model: "m", headers: RequestHeaders{ModelNameRewrite: "m-pinned"},
			wantCrit: scheduling.Standard, wantTarget: "m-pinned", wantRewrittenBy: RewrittenByHeader,
		},
		{
			name:   "a matching rule wins over the model name rewrite header, as upstream applies it",
			config: ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("from-rule", nil)))}},
			model:  "m", headers: RequestHeaders{ModelNameRewrite: "m-pinned"},
			wantCrit: scheduling.Standard, wantTarget: "from-rule", wantRewrittenBy: "InferenceModelRewrite default/rw (inference.networking.x-k8s.io) rule 0",
		},
		{
			name:     "a matching rule without targets leaves the model as requested",
			config:   ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"m"}))}},
			model:    "m",
			wantCrit: scheduling.Standard, wantTarget: "m", wantListed: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewModels()
			s.Set(tt.config)
			res := s.Resolve(tt.model, tt.headers, rand.New(rand.NewPCG(1, 2)))
			assert.Equal(t, tt.wantCrit, res.Criticality, "criticality")
			if tt.wantObjective == "" {
				assert.Nil(t, res.Objective, "objective")
			} else if assert.NotNil(t, res.Objective, "objective") {
				assert.Equal(t, tt.wantObjective, res.Objective.Name, "objective")
			}
			assert.Equal(t, tt.wantUnknown, res.UnknownObjective, "unknown objective")
			assert.Equal(t, tt.wantTarget, res.TargetModel, "target model")
			assert.Equal(t, tt.wantRewrittenBy, res.RewrittenBy, "rewritten by")
			assert.Equal(t, tt.wantListed, res.Listed, "listed")
			assert.Equal(t, res.Criticality, s.Criticality(tt.model, tt.headers.Objective), "Criticality agrees with Resolve")
		})
	}
}

func TestRewriteWeights(t *testing.T) {
	const draws = 20000
	tests := []struct {
		name    string
		targets []v1alpha2.ModelRewriteTarget
		want    map[string]float64
		// wantNote is in the notes Set returns, when not empty.
		wantNote string
	}{
		{
			name:    "a canary split: weight / sum of the weights",
			targets: []v1alpha2.ModelRewriteTarget{requestmodeltest.RewriteTarget("stable", ptr.To[int32](90)), requestmodeltest.RewriteTarget("canary", ptr.To[int32](10))},
			want:    map[string]float64{"stable": 0.9, "canary": 0.1},
		},
		{
			name:    "weights are not percentages",
			targets: []v1alpha2.ModelRewriteTarget{requestmodeltest.RewriteTarget("a", ptr.To[int32](1)), requestmodeltest.RewriteTarget("b", ptr.To[int32](3))},
			want:    map[string]float64{"a": 0.25, "b": 0.75},
		},
		{
			name:    "no weights: the targets share equally",
			targets: []v1alpha2.ModelRewriteTarget{requestmodeltest.RewriteTarget("a", nil), requestmodeltest.RewriteTarget("b", nil)},
			want:    map[string]float64{"a": 0.5, "b": 0.5},
		},
		{
			name:     "weights on some targets only: the others are never chosen (as the llm-d router does), and Set says so",
			targets:  []v1alpha2.ModelRewriteTarget{requestmodeltest.RewriteTarget("a", ptr.To[int32](1)), requestmodeltest.RewriteTarget("b", nil)},
			want:     map[string]float64{"a": 1},
			wantNote: "only 1 of 2 targets have a weight",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewModels()
			notes := s.Set(ModelConfig{Rewrites: []*v1alpha2.InferenceModelRewrite{requestmodeltest.Rewrite("rw", requestmodeltest.Rule([]string{"m"}, tt.targets...))}})
			if tt.wantNote != "" {
				require.Len(t, notes, 1)
				assert.Contains(t, notes[0], tt.wantNote)
			} else {
				assert.Empty(t, notes)
			}
			r := rand.New(rand.NewPCG(1, 2))
			counts := map[string]int{}
			for range draws {
				counts[s.Resolve("m", RequestHeaders{}, r).TargetModel]++
			}
			assert.Len(t, counts, len(tt.want))
			for name, share := range tt.want {
				assert.InDelta(t, share, float64(counts[name])/draws, 0.015, name)
			}
		})
	}
}

func TestSetReportsShadowedObjects(t *testing.T) {
	s := NewModels()
	notes := s.Set(ModelConfig{
		Objectives: []*v1alpha2.InferenceObjective{aged(requestmodeltest.Objective("batch", ptr.To[int32](1)), 1), aged(ObjectiveFromLLMD(requestmodeltest.LLMDObjective("batch", -1)), 2)},
		Rewrites: []*v1alpha2.InferenceModelRewrite{
			aged(requestmodeltest.Rewrite("older", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("x", nil)), requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("y", nil))), 1),
			aged(requestmodeltest.Rewrite("newer", requestmodeltest.Rule([]string{"m"}, requestmodeltest.RewriteTarget("z", nil)), requestmodeltest.Rule(nil, requestmodeltest.RewriteTarget("w", nil))), 2),
		},
	})
	assert.ElementsMatch(t, []string{
		`InferenceObjective default/batch (inference.networking.x-k8s.io) (objective "batch" is already defined by InferenceObjective default/batch (llm-d.ai))`,
		`InferenceModelRewrite default/newer (inference.networking.x-k8s.io) rule 0: model "m" is already rewritten by the older InferenceModelRewrite default/older (inference.networking.x-k8s.io) rule 0`,
		`InferenceModelRewrite default/newer (inference.networking.x-k8s.io) rule 1 matches every model and is shadowed by the older InferenceModelRewrite default/older (inference.networking.x-k8s.io) rule 1`,
	}, notes)
	models, objectives, rules := s.Counts()
	assert.Equal(t, []int{0, 1, 4}, []int{models, objectives, rules})
}

func TestReadRequestHeaders(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    RequestHeaders
	}{
		{name: "none", want: RequestHeaders{}},
		{
			name:    "GIE's names",
			headers: map[string]string{ObjectiveHeader: "batch", FairnessIDHeader: "tenant-a", ModelNameRewriteHeader: "m2"},
			want:    RequestHeaders{Objective: "batch", FairnessID: "tenant-a", ModelNameRewrite: "m2"},
		},
		{
			name:    "the llm-d router's names",
			headers: map[string]string{LLMDObjectiveHeader: "batch", LLMDFairnessIDHeader: "tenant-a", LLMDModelNameRewriteHeader: "m2"},
			want:    RequestHeaders{Objective: "batch", FairnessID: "tenant-a", ModelNameRewrite: "m2"},
		},
		{
			name:    "both: the llm-d name first, as the llm-d router reads them",
			headers: map[string]string{LLMDObjectiveHeader: "new", ObjectiveHeader: "old"},
			want:    RequestHeaders{Objective: "new"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, ReadRequestHeaders(func(n string) string { return tt.headers[n] }))
		})
	}
}

// modelConfigYAML has one of each kind mci-epp reads, in both groups.
const modelConfigYAML = `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata:
  name: critical-chat
spec:
  priority: 10
  poolRef:
    name: pool
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata:
  name: background
spec:
  priority: -1
  poolRef:
    group: inference.networking.k8s.io
    name: pool
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: food-review-canary
spec:
  poolRef:
    name: pool
  rules:
  - matches:
    - model:
        type: Exact
        value: food-review
    targets:
    - modelRewrite: food-review-v1
      weight: 90
    - modelRewrite: food-review-v2
      weight: 10
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: default-model
spec:
  poolRef:
    name: pool
  rules:
  - targets:
    - modelRewrite: base
`

func TestLoadModelConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
	}{
		{name: "objectives and rewrites of both groups, with an InferenceModel", yaml: seedModel + "---\n" + modelConfigYAML},
		{name: "an unknown field of an objective", yaml: strings.Replace(modelConfigYAML, "priority: 10", "prio: 10", 1), wantErr: `document 1 (InferenceObjective "critical-chat"): error unmarshaling JSON: while decoding JSON: json: unknown field "prio"`},
		{name: "a priority that is not an integer", yaml: strings.Replace(modelConfigYAML, "priority: 10", "priority: high", 1), wantErr: `document 1 (InferenceObjective "critical-chat")`},
		{name: "an objective without a poolRef name", yaml: strings.Replace(modelConfigYAML, "    name: pool\n", "    name: \"\"\n", 1), wantErr: `document 1 (InferenceObjective "critical-chat"): spec.poolRef.name is required`},
		{name: "an llm-d.ai objective's problems name it too", yaml: strings.Replace(modelConfigYAML, "priority: -1", "priority: [-1]", 1), wantErr: `document 2 (InferenceObjective "background")`},
		{name: "a match type other than Exact", yaml: strings.Replace(modelConfigYAML, "type: Exact", "type: Prefix", 1), wantErr: `document 3 (InferenceModelRewrite "food-review-canary"): spec.rules[0].matches[0].model.type "Prefix": want Exact`},
		{name: "a weight out of range", yaml: strings.Replace(modelConfigYAML, "weight: 10", "weight: 0", 1), wantErr: "spec.rules[0].targets[1].weight 0: want 1 to 1000000"},
		{name: "weights on some targets only", yaml: strings.Replace(modelConfigYAML, "      weight: 10\n", "", 1), wantErr: "spec.rules[0].targets: set a weight on every target or on none"},
		{name: "a target without a model", yaml: strings.Replace(modelConfigYAML, "modelRewrite: base", "modelRewrite: \"\"", 1), wantErr: `document 4 (InferenceModelRewrite "default-model"): spec.rules[0].targets[0].modelRewrite is required`},
		{name: "a rewrite without rules", yaml: strings.Replace(modelConfigYAML, "  rules:\n  - targets:\n    - modelRewrite: base\n", "", 1), wantErr: "spec.rules is required"},
		{name: "an InferenceModel in the llm-d.ai group, which never had one", yaml: strings.Replace(seedModel, "inference.networking.x-k8s.io/v1alpha2", "llm-d.ai/v1alpha2", 1), wantErr: `document 1: apiVersion "llm-d.ai/v1alpha2", kind "InferenceModel": want`},
		{name: "one objective name twice in a group", yaml: modelConfigYAML + "---\n" + modelConfigYAML[:strings.Index(modelConfigYAML, "---")], wantErr: `document 5 (InferenceObjective "critical-chat"): InferenceObjective "critical-chat" of inference.networking.x-k8s.io/v1alpha2 is already defined in document 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadModelConfig(strings.NewReader(tt.yaml))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Equal(t, ModelConfig{}, cfg, "nothing of a bad file is used")
				return
			}
			require.NoError(t, err)
		})
	}

	t.Run("what the documents say is what the EPP does", func(t *testing.T) {
		cfg, err := LoadModelConfig(strings.NewReader(modelConfigYAML))
		require.NoError(t, err)
		require.Len(t, cfg.Objectives, 2)
		require.Len(t, cfg.Rewrites, 2)
		s := NewModels()
		require.Empty(t, s.Set(cfg))
		r := rand.New(rand.NewPCG(1, 2))
		assert.Equal(t, scheduling.Critical, s.Resolve("m", RequestHeaders{Objective: "critical-chat"}, r).Criticality)
		bg := s.Resolve("m", RequestHeaders{Objective: "background"}, r)
		assert.Equal(t, scheduling.Sheddable, bg.Criticality)
		assert.Equal(t, "InferenceObjective /background (llm-d.ai)", bg.Objective.Source)
		assert.Equal(t, "base", bg.TargetModel, "the llm-d.ai generic rule")
		counts := map[string]int{}
		for range 10000 {
			counts[s.Resolve("food-review", RequestHeaders{}, r).TargetModel]++
		}
		assert.InDelta(t, 0.9, float64(counts["food-review-v1"])/10000, 0.02)
		assert.InDelta(t, 0.1, float64(counts["food-review-v2"])/10000, 0.02)
	})
}
