package virtual

import (
	"reflect"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// recomputeDuration times the Store's passes: a change waits for the pass
// under way and the rest after it (Store.rest, as long as the pass), then
// its own pass, so their length bounds how fast a change reaches the
// watchers; their count says how often events wake the Store.
var recomputeDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
	Name: "mci_apiserver_recompute_duration_seconds",
	Help: "How long each pass of a virtual resource's Store took, by kind of the objects it serves and by work: " +
		"objects (it computed objects again), versions (its events only moved the members' versions; nothing was computed).",
	Buckets:        metrics.ExponentialBuckets(0.0005, 2, 14),
	StabilityLevel: metrics.ALPHA,
}, []string{"kind", "work"})

func init() {
	legacyregistry.MustRegister(recomputeDuration)
}

// kindOf is the name of the type of the objects newFunc makes; none
// without newFunc.
func kindOf(newFunc func() Object) string {
	if newFunc == nil {
		return ""
	}
	t := reflect.TypeOf(newFunc())
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}
