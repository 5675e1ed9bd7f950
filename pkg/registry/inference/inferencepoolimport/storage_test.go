package inferencepoolimport

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// index answers from maps: Affected only maps events to keys.
type index struct {
	local         string
	routedThrough map[string][]string
	routedFrom    map[string][]string
	withParent    map[string][]string
}

func (i index) LocalName() string                         { return i.local }
func (i index) PoolsUsingService(_, _, _ string) []string { return nil }
func (i index) PoolsWithParent(member, namespace, gateway string) []string {
	return i.withParent[member+"/"+namespace+"/"+gateway]
}
func (i index) ImportsRoutedThrough(namespace, gateway string) []string {
	return i.routedThrough[namespace+"/"+gateway]
}
func (i index) ImportsRoutedFrom(namespace string) []string { return i.routedFrom[namespace] }

func TestAffectedByRoutesGatewaysAndGrants(t *testing.T) {
	r := Resource{Index: index{
		local:         "cluster-b",
		routedThrough: map[string][]string{"demo/gw": {"demo/llm-pool"}},
		routedFrom:    map[string][]string{"team": {"demo/llm-pool"}},
		withParent:    map[string][]string{"cluster-a/demo/gw": {"demo/parent-pool"}},
	}}
	tests := []struct {
		name string
		ev   clusterset.Event
		want virtual.Dirty
	}{
		{
			name: "an HTTPRoute change recomputes the imports it used before and after",
			ev:   clusterset.Event{Member: "cluster-b", Kind: clusterset.KindHTTPRoute, Namespace: "demo", Name: "r", Imports: []string{"demo/a", "demo/b"}},
			want: virtual.Dirty{Keys: []string{"demo/a", "demo/b"}},
		},
		{
			name: "a local Gateway change recomputes the imports its routes use",
			ev:   clusterset.Event{Member: "cluster-b", Kind: clusterset.KindGateway, Namespace: "demo", Name: "gw"},
			want: virtual.Dirty{Keys: []string{"demo/llm-pool"}},
		},
		{
			name: "another member's Gateway change recomputes only the pools it parents there",
			ev:   clusterset.Event{Member: "cluster-a", Kind: clusterset.KindGateway, Namespace: "demo", Name: "gw"},
			want: virtual.Dirty{Keys: []string{"demo/parent-pool"}},
		},
		{
			name: "a ReferenceGrant change recomputes the imports of its namespace",
			ev:   clusterset.Event{Member: "cluster-b", Kind: clusterset.KindReferenceGrant, Namespace: "demo", Name: "g"},
			want: virtual.Dirty{Namespaces: []string{"demo"}},
		},
		{
			name: "a local namespace change recomputes the imports of that namespace and those its routes use (its labels meet listeners' namespace selectors)",
			ev:   clusterset.Event{Member: "cluster-b", Kind: clusterset.KindNamespace, Namespace: "team", Name: "team"},
			want: virtual.Dirty{Namespaces: []string{"team"}, Keys: []string{"demo/llm-pool"}},
		},
		{
			name: "another member's namespace change recomputes no import",
			ev:   clusterset.Event{Member: "cluster-a", Kind: clusterset.KindNamespace, Namespace: "team", Name: "team"},
			want: virtual.Dirty{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, r.Affected(tt.ev))
		})
	}
}
