package requestmodel

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
)

// FuzzLoadModelConfig reads model configuration files and resolves
// requests with what they hold: a refused file gives nothing; an accepted
// one resolves every model it lists, and the model a request is sent for
// is never empty and always one that the file or the request names.
//
// Trusted input: the operator's model configuration file (tenants'
// objects reach Set through the API server, whose CRDs check what
// LoadModelConfig checks).
func FuzzLoadModelConfig(f *testing.F) {
	for _, s := range []string{
		seedModel, modelConfigYAML, seedModel + "---\n" + modelConfigYAML, "", "---\n---\n# only a comment\n",
		"apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: a}\nspec: {modelName: m, targetModels: [{name: t, weight: 0}]}\n",
		"apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: a}\nspec: {modelName: m, poolRef: {name: p}, targetModels: [{name: t, weight: 2147483647}, {name: u, weight: 1}]}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: r}\nspec: {poolRef: {name: p}, rules: [{matches: [{model: {value: m}}], targets: []}]}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: r}\nspec: {poolRef: {name: p}, rules: [{}]}\n",
		"kind: [\n", "a: &a [*a, *a]\n", "apiVersion: 1\nkind: {}\n", "\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := LoadModelConfig(bytes.NewReader(data))
		if err != nil {
			require.Equal(t, ModelConfig{}, cfg, "a refused file gave configuration")
			return
		}
		named := sets.New[string]()
		for _, im := range cfg.Models {
			named.Insert(im.Spec.ModelName)
			for _, tm := range im.Spec.TargetModels {
				named.Insert(tm.Name)
			}
		}
		var matched []string
		for _, rw := range cfg.Rewrites {
			for _, r := range rw.Spec.Rules {
				for _, m := range r.Matches {
					matched = append(matched, m.Model.Value)
				}
				for _, tg := range r.Targets {
					named.Insert(tg.ModelRewrite)
				}
			}
		}
		s := NewModels()
		s.Set(cfg)
		models, objectives, _ := s.Counts()
		require.LessOrEqual(t, models, len(cfg.Models))
		require.LessOrEqual(t, objectives, len(cfg.Objectives))
		r := rand.New(rand.NewPCG(1, 2))
		check := func(model string) {
			res := s.Resolve(model, RequestHeaders{}, r)
			require.True(t, res.Listed, "model %q is listed", model)
			require.NotEmpty(t, res.TargetModel)
			require.True(t, res.TargetModel == model || named.Has(res.TargetModel), "model %q resolved to %q, which nothing names", model, res.TargetModel)
		}
		for _, im := range cfg.Models {
			check(im.Spec.ModelName)
		}
		for _, m := range matched {
			check(m)
		}
		res := s.Resolve("unlisted-model", RequestHeaders{ModelNameRewrite: "from-header"}, r)
		require.NotEmpty(t, res.TargetModel)
	})
}
