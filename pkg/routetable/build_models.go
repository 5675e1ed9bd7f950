package routetable

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

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
