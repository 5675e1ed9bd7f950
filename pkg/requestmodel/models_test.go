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
	"github.com/mci-dev/mci/pkg/requestmodel/requestmodeltest"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// seedModel is seed 001's InferenceModel.
const seedModel = `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModel
metadata:
  name: inferencemodel-llama2
spec:
  modelName: llama2
  criticality: Critical
  poolRef:
    name: vllm-llama2-7b-pool
  targetModels:
  - name: vllm-llama2-7b-2024-11-20
    weight: 75
  - name: vllm-llama2-7b-2025-03-24
    weight: 25
`

func TestTargetModel(t *testing.T) {
	const draws = 20000
	tests := []struct {
		name string
		im   *v1alpha2.InferenceModel
		// want is the expected share of each target.
		want map[string]float64
	}{
		{
			name: "targets are chosen by weight",
			im:   requestmodeltest.InferenceModel("m", "llama2", nil, requestmodeltest.Target("a", ptr.To[int32](75)), requestmodeltest.Target("b", ptr.To[int32](25))),
			want: map[string]float64{"a": 0.75, "b": 0.25},
		},
		{
			name: "targets without weights share equally",
			im:   requestmodeltest.InferenceModel("m", "llama2", nil, requestmodeltest.Target("a", nil), requestmodeltest.Target("b", nil), requestmodeltest.Target("c", nil)),
			want: map[string]float64{"a": 1.0 / 3, "b": 1.0 / 3, "c": 1.0 / 3},
		},
		{
			name: "a target of weight 0 is never chosen",
			im:   requestmodeltest.InferenceModel("m", "llama2", nil, requestmodeltest.Target("a", ptr.To[int32](0)), requestmodeltest.Target("b", ptr.To[int32](5))),
			want: map[string]float64{"b": 1},
		},
		{
			name: "all weights 0 share equally",
			im:   requestmodeltest.InferenceModel("m", "llama2", nil, requestmodeltest.Target("a", ptr.To[int32](0)), requestmodeltest.Target("b", ptr.To[int32](0))),
			want: map[string]float64{"a": 0.5, "b": 0.5},
		},
		{
			name: "a single target is always chosen",
			im:   requestmodeltest.InferenceModel("m", "llama2", nil, requestmodeltest.Target("only", ptr.To[int32](3))),
			want: map[string]float64{"only": 1},
		},
		{
			name: "no targets: the model is its own target",
			im:   requestmodeltest.InferenceModel("m", "llama2", nil),
			want: map[string]float64{"llama2": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModel(tt.im)
			r := rand.New(rand.NewPCG(1, 2))
			counts := map[string]int{}
			for range draws {
				counts[m.TargetModel(r)]++
			}
			assert.Len(t, counts, len(tt.want))
			for name, share := range tt.want {
				// 4 standard deviations of a binomial share at most.
				assert.InDelta(t, share, float64(counts[name])/draws, 0.015, name)
			}
		})
	}
}

func TestModelsSet(t *testing.T) {
	critical, sheddable := ptr.To(v1alpha2.Critical), ptr.To(v1alpha2.Sheddable)
	older := requestmodeltest.InferenceModel("older", "llama2", critical)
	older.CreationTimestamp = metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	newer := requestmodeltest.InferenceModel("newer", "llama2", sheddable)
	newer.CreationTimestamp = metav1.NewTime(time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC))

	s := NewModels()
	ignored := s.Set(ModelConfig{Models: []*v1alpha2.InferenceModel{newer, older, requestmodeltest.InferenceModel("other", "other", nil)}})
	require.Equal(t, 2, s.Len())
	assert.Equal(t, scheduling.Critical, s.Get("llama2").Criticality, "the oldest InferenceModel of a model name wins")
	assert.Equal(t, "default/older", s.Get("llama2").Source)
	require.Len(t, ignored, 1)
	assert.Contains(t, ignored[0], "default/newer")
	assert.Equal(t, scheduling.Standard, s.Get("other").Criticality, "no criticality is Standard")
	assert.Nil(t, s.Get("unknown"))

	s.Set(ModelConfig{})
	assert.Equal(t, 0, s.Len())
}

func TestLoadModelConfigInferenceModels(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    []string // model names
		wantErr string
	}{
		{name: "seed 001's InferenceModel", yaml: seedModel, want: []string{"llama2"}},
		{
			name: "a stream of documents with comments and empty documents",
			yaml: "# models\n---\n" + seedModel + "---\n# nothing\n---\n" + strings.ReplaceAll(strings.ReplaceAll(seedModel, "llama2\n", "other\n"), "inferencemodel-llama2", "inferencemodel-other"),
			want: []string{"llama2", "other"},
		},
		{name: "an empty file", yaml: "", want: nil},
		{name: "YAML that does not parse", yaml: "kind: [InferenceModel\n", wantErr: "document 1"},
		{name: "an unknown field", yaml: strings.Replace(seedModel, "criticality:", "critical1ty:", 1), wantErr: `unknown field "critical1ty"`},
		{name: "another kind", yaml: strings.Replace(seedModel, "kind: InferenceModel", "kind: InferencePool", 1), wantErr: "want inference.networking.x-k8s.io/v1alpha2 InferenceModel, or InferenceObjective or InferenceModelRewrite in inference.networking.x-k8s.io/v1alpha2 or llm-d.ai/v1alpha2"},
		{name: "an unknown criticality", yaml: strings.Replace(seedModel, "Critical", "Urgent", 1), wantErr: `spec.criticality "Urgent"`},
		{name: "no model name", yaml: strings.Replace(seedModel, "modelName: llama2", "modelName: \"\"", 1), wantErr: "spec.modelName is required"},
		{name: "a weight out of range", yaml: strings.Replace(seedModel, "weight: 75", "weight: 0", 1), wantErr: "spec.targetModels[0].weight 0"},
		{name: "weights on some targets only", yaml: strings.Replace(seedModel, "    weight: 25\n", "", 1), wantErr: "set a weight on every target or on none"},
		{name: "a name defined twice", yaml: seedModel + "---\n" + seedModel, wantErr: "document 2 (InferenceModel \"inferencemodel-llama2\"): InferenceModel \"inferencemodel-llama2\" of inference.networking.x-k8s.io/v1alpha2 is already defined in document 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadModelConfig(strings.NewReader(tt.yaml))
			got := cfg.Models
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, im := range got {
				names = append(names, im.Spec.ModelName)
			}
			assert.Equal(t, tt.want, names)
		})
	}

	t.Run("the seed's weights and criticality are read", func(t *testing.T) {
		cfg, err := LoadModelConfig(strings.NewReader(seedModel))
		require.NoError(t, err)
		m := newModel(cfg.Models[0])
		assert.Equal(t, scheduling.Critical, m.Criticality)
		assert.Equal(t, []string{"vllm-llama2-7b-2024-11-20", "vllm-llama2-7b-2025-03-24"}, m.Targets())
		assert.Equal(t, []int64{75, 100}, m.targets.cum)
	})
}
