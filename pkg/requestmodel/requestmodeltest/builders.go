// Package requestmodeltest builds the model configuration objects (of the
// pool "pool" in namespace "default") that the tests of pkg/requestmodel and
// of its users, such as the EPP, configure.
package requestmodeltest

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
)

// InferenceModel builds an InferenceModel of modelName.
func InferenceModel(name, modelName string, crit *v1alpha2.Criticality, targets ...v1alpha2.TargetModel) *v1alpha2.InferenceModel {
	return &v1alpha2.InferenceModel{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha2.InferenceModelSpec{
			ModelName:    modelName,
			Criticality:  crit,
			TargetModels: targets,
			PoolRef:      v1alpha2.PoolObjectReference{Name: "pool"},
		},
	}
}

// Target is a target model of an InferenceModel.
func Target(name string, weight *int32) v1alpha2.TargetModel {
	return v1alpha2.TargetModel{Name: name, Weight: weight}
}

// Objective builds an InferenceObjective of inference.networking.x-k8s.io.
func Objective(name string, priority *int32) *v1alpha2.InferenceObjective {
	return &v1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1alpha2.InferenceObjectiveSpec{Priority: priority, PoolRef: v1alpha2.PoolObjectReference{Name: "pool"}},
	}
}

// LLMDObjective builds an InferenceObjective of llm-d.ai.
func LLMDObjective(name string, priority int32) *llmdv1alpha2.InferenceObjective {
	return &llmdv1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1alpha2.InferenceObjectiveSpec{Priority: &priority, PoolRef: v1alpha2.PoolObjectReference{Name: "pool"}},
	}
}

// Rewrite builds an InferenceModelRewrite with rules.
func Rewrite(name string, rules ...v1alpha2.InferenceModelRewriteRule) *v1alpha2.InferenceModelRewrite {
	return &v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1alpha2.InferenceModelRewriteSpec{PoolRef: &v1alpha2.PoolObjectReference{Name: "pool"}, Rules: rules},
	}
}

// Rule matches the models exactly (every model when there are none).
func Rule(models []string, targets ...v1alpha2.ModelRewriteTarget) v1alpha2.InferenceModelRewriteRule {
	r := v1alpha2.InferenceModelRewriteRule{Targets: targets}
	for _, m := range models {
		r.Matches = append(r.Matches, v1alpha2.Match{Model: &v1alpha2.ModelMatch{Value: m}})
	}
	return r
}

// RewriteTarget is a target of a rewrite rule.
func RewriteTarget(model string, weight *int32) v1alpha2.ModelRewriteTarget {
	return v1alpha2.ModelRewriteTarget{ModelRewrite: model, Weight: weight}
}
