package imports

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// verdict is a condition before it has a type and a generation: whether it
// holds, a CamelCase reason and a message a person can act on.
type verdict struct {
	ok      bool
	reason  string
	message string
}

// condition turns a verdict into a condition. LastTransitionTime is left
// zero on purpose: the computation has no clock and must give the same
// answer on every replica; the server fills it with CarryTransitionTimes.
func (v verdict) condition(conditionType string, generation int64) metav1.Condition {
	status := metav1.ConditionFalse
	if v.ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{
		Type:               conditionType,
		Status:             status,
		ObservedGeneration: generation,
		Reason:             v.reason,
		Message:            v.message,
	}
}
