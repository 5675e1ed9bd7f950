package imports

import (
	"encoding/json"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// FuzzSummaryEntry reads arbitrary InferencePoolExportSummaries, as a
// hostile member may publish them: never a panic; an entry is ready only
// with a routing mode this server knows and a Ready condition that says
// True; an endpoint-mode entry always has an EndpointPicker; and the entry
// shares no memory with the member's object (which sits in its cache).
func FuzzSummaryEntry(f *testing.F) {
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready"}
	for _, s := range []v1alpha1.InferencePoolExportSummary{
		{Status: v1alpha1.InferencePoolExportSummaryStatus{RoutingMode: v1alpha1.RoutingModeEndpoint, Conditions: []metav1.Condition{ready}}},
		{Status: v1alpha1.InferencePoolExportSummaryStatus{RoutingMode: v1alpha1.RoutingModeParent, Conditions: []metav1.Condition{ready}}},
		{Status: v1alpha1.InferencePoolExportSummaryStatus{RoutingMode: "Teleport", Conditions: []metav1.Condition{ready}}},
		{Status: v1alpha1.InferencePoolExportSummaryStatus{RoutingMode: v1alpha1.RoutingModeEndpoint}},
		{Status: v1alpha1.InferencePoolExportSummaryStatus{Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalidExport}}}},
	} {
		data, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"status":{"routingMode":"Endpoint","endpointPicker":{"service":[{"name":"x","ports":[{"port":-1}]}]},"conditions":[{"type":"Ready","status":"True"},{"type":"Ready","status":"False"}]}}`))
	f.Add([]byte(`{"status":{"routingMode":"Parent","parents":[{"name":""}],"targetPortNumber":70000}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s v1alpha1.InferencePoolExportSummary
		if json.Unmarshal(data, &s) != nil {
			return
		}
		orig := s.DeepCopy()
		entry, v := summaryEntry("cluster-a", &s)
		if !equality.Semantic.DeepEqual(orig, &s) {
			t.Fatalf("summaryEntry changed the member's summary")
		}
		if v.ok {
			known := entry.RoutingMode == inference.RoutingModeEndpoint || entry.RoutingMode == inference.RoutingModeParent
			if !known {
				t.Fatalf("an entry with routing mode %q is ready", entry.RoutingMode)
			}
			c := metaReady(orig)
			if c == nil || c.Status != metav1.ConditionTrue {
				t.Fatalf("an entry is ready without a Ready condition that says True: %+v", orig.Status.Conditions)
			}
		} else if v.reason == "" {
			t.Fatalf("an entry that is not ready has no reason")
		}
		if entry.RoutingMode == inference.RoutingModeEndpoint && v.reason != v1alpha1.ReasonInvalidExport && entry.EndpointPicker == nil {
			t.Fatalf("an endpoint-mode entry has no EndpointPicker")
		}
		if entry.Conditions != nil {
			t.Fatalf("the entry carries the member's conditions")
		}
		// Scribble over the member's object: the entry must not change.
		before := entry.DeepCopy()
		scribble(reflect.ValueOf(&s.Status).Elem())
		if !equality.Semantic.DeepEqual(before, &entry) {
			t.Fatalf("the entry shares memory with the member's summary")
		}
	})
}

// metaReady is the summary's first Ready condition, as summaryEntry reads it.
func metaReady(s *v1alpha1.InferencePoolExportSummary) *metav1.Condition {
	for i := range s.Status.Conditions {
		if s.Status.Conditions[i].Type == v1alpha1.ConditionReady {
			return &s.Status.Conditions[i]
		}
	}
	return nil
}

// scribble overwrites every string and integer reachable from v.
func scribble(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			scribble(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				scribble(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			scribble(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			scribble(e)
			v.SetMapIndex(k, e)
		}
	case reflect.String:
		v.SetString(v.String() + "-scribbled")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() ^ 0x5a)
	}
}
