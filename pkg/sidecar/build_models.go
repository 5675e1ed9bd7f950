package sidecar

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// indexModels groups the InferenceModels and InferenceObjectives by the
// pool they name.
func (b *builder) indexModels() {
	byPool := map[types.NamespacedName]*requestmodel.ModelConfig{}
	of := func(k types.NamespacedName) *requestmodel.ModelConfig {
		if byPool[k] == nil {
			byPool[k] = &requestmodel.ModelConfig{}
		}
		return byPool[k]
	}
	for _, m := range b.in.Models {
		c := of(types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.PoolRef.Name})
		c.Models = append(c.Models, m)
	}
	for _, o := range b.in.Objectives {
		if k, ok := objectivePool(o); ok {
			c := of(k)
			c.Objectives = append(c.Objectives, o)
		}
	}
	keys := make([]types.NamespacedName, 0, len(byPool))
	for k := range byPool {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y types.NamespacedName) int { return strings.Compare(x.String(), y.String()) })
	for _, k := range keys {
		ms, errs := modelsOf(k, *byPool[k])
		b.models[k] = ms
		b.errs = append(b.errs, errs...)
	}
}

// objectivePool is the pool an InferenceObjective names; false when its
// poolRef is of another kind or group than InferencePool.
func objectivePool(o *v1alpha2.InferenceObjective) (types.NamespacedName, bool) {
	ref := o.Spec.PoolRef
	ok := (ref.Kind == "" || ref.Kind == "InferencePool") && (ref.Group == "" || ref.Group == poolv1.SchemeGroupVersion.Group)
	return types.NamespacedName{Namespace: o.Namespace, Name: ref.Name}, ok
}

// modelsOf indexes the InferenceModels and InferenceObjectives of one pool.
func modelsOf(pool types.NamespacedName, c requestmodel.ModelConfig) (*requestmodel.Models, []error) {
	ms := requestmodel.NewModels()
	var errs []error
	for _, ignored := range ms.Set(c) {
		errs = append(errs, &BuildError{Kind: "InferenceModel", Namespace: pool.Namespace, Reason: ReasonConflictingModel, Message: ignored})
	}
	return ms, errs
}
