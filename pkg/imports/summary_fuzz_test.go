package imports

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
)

// FuzzSummaryEntry reads InferencePoolExportSummaries as a member
// publishes them: a Ready entry has a routing mode this server knows (an
// EPP to reach in EndpointMode) and a Ready condition that says True; a
// summary this server cannot read is never Ready; the reason passed on is
// one a condition can carry; the endpoint addresses passed on parse
// (publishedaddrs.Parse), and only in EndpointMode; and the entry shares no memory with the
// member's object, which stays in its cache.
func FuzzSummaryEntry(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"namespace":"ns","name":"pool"},"status":{"routingMode":"EndpointMode","targetPortNumber":8000,"endpointPicker":{"name":"epp","service":[{"type":"ClusterIP","addresses":["10.0.0.1"],"ports":[{"number":9002}]}],"health":{"port":9003},"metrics":{"port":9090}},"conditions":[{"type":"Ready","status":"True","reason":"Ready","message":"ok"}]}}`,
		`{"metadata":{"namespace":"ns","name":"pool"},"status":{"routingMode":"ParentMode","parents":[{"name":"gw","namespace":"ns","service":[{"addresses":["10.0.0.2"],"ports":[{"number":80}]}],"conditions":[{"type":"Accepted","status":"True"}]}],"conditions":[{"type":"Ready","status":"False","reason":"NotReady"}]}}`,
		`{"status":{"routingMode":"EndpointMode","conditions":[{"type":"Ready","status":"True"}]}}`,
		`{"status":{"routingMode":"Teleport","conditions":[{"type":"Ready","status":"True"}]}}`,
		`{"status":{"routingMode":"","conditions":[{"type":"Ready","status":"False","reason":"InvalidExport","message":"bad"}]}}`,
		`{"status":{"routingMode":"ParentMode"}}`,
		`{"status":{"routingMode":"EndpointMode","conditions":[{"type":"Ready","status":"Maybe"},{"type":"Ready","status":"True"}]}}`,
		`{"status":{"routingMode":"EndpointMode","conditions":[{"type":"Ready","status":"False","reason":"Not Ready!","message":"x"}]}}`,
		`{"status":{"routingMode":"EndpointMode","conditions":[{"type":"Ready","status":"False","reason":"` + strings.Repeat("R", 1025) + `"}]}}`,
		`{}`,
		`{"status":{"routingMode":"EndpointMode","endpointAddresses":["10.1.0.5","10.2.0.0/24","fd00::/64"],"conditions":[{"type":"Ready","status":"True","reason":"Ready"}]}}`,
		`{"status":{"routingMode":"EndpointMode","endpointAddresses":["0.0.0.0/0"],"conditions":[{"type":"Ready","status":"True","reason":"Ready"}]}}`,
		`{"status":{"routingMode":"ParentMode","endpointAddresses":["10.1.0.5"],"conditions":[{"type":"Ready","status":"True","reason":"Ready"}]}}`,
	} {
		f.Add("cluster-a", []byte(s))
	}
	f.Fuzz(func(t *testing.T, member string, data []byte) {
		s := &v1alpha1.InferencePoolExportSummary{}
		if json.Unmarshal(data, s) != nil {
			return
		}
		entry, v := summaryEntry(member, s)
		require.Nil(t, entry.Conditions, "the member's conditions are not the import's")
		if v.ok {
			require.Contains(t, []inference.RoutingMode{inference.RoutingModeEndpoint, inference.RoutingModeParent}, entry.RoutingMode)
			require.True(t, entry.RoutingMode != inference.RoutingModeEndpoint || entry.EndpointPicker != nil, "a Ready EndpointMode entry without an EPP")
			c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady)
			require.NotNil(t, c)
			require.Equal(t, "True", string(c.Status))
		}
		if len(entry.EndpointAddresses) > 0 {
			require.Equal(t, inference.RoutingModeEndpoint, entry.RoutingMode, "endpoint addresses outside EndpointMode")
			_, err := publishedaddrs.Parse(entry.EndpointAddresses)
			require.NoError(t, err, "endpoint addresses passed on that do not parse")
		}
		require.Empty(t, readyConditionProblems(&metav1.Condition{Status: metav1.ConditionFalse, Reason: v.reason}), "the import's Ready condition could not carry reason %q", v.reason)
		want := entry.DeepCopy()
		poison(reflect.ValueOf(s).Elem())
		require.Equal(t, want, &entry, "the entry shares memory with the member's summary")
	})
}

// poison overwrites every string, number and bool reachable from v, in
// place, so that whatever shares memory with v changes with it.
func poison(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			poison(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				poison(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			poison(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			poison(e)
			v.SetMapIndex(k, e)
		}
	case reflect.String:
		v.SetString("poison")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(-7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	}
}
