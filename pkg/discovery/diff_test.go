package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDiff(t *testing.T) {
	a := Instance{ID: "pod-a", Namespace: "ns", Address: "192.0.2.1", Port: 8000}
	b := Instance{ID: "pod-b", Namespace: "ns", Address: "192.0.2.2", Port: 8000}
	c := Instance{ID: "pod-c", Namespace: "ns", Address: "192.0.2.3", Port: 8000}
	aMoved := a
	aMoved.Address = "192.0.2.9"

	set := func(insts ...Instance) map[string]Instance {
		m := map[string]Instance{}
		for _, i := range insts {
			m[i.ID] = i
		}
		return m
	}
	added := func(i Instance) Event { return Event{Type: InstanceAdded, Instance: i} }
	removed := func(i Instance) Event { return Event{Type: InstanceRemoved, Instance: i} }

	tests := []struct {
		name          string
		before, after map[string]Instance
		want          []Event
	}{
		{name: "nothing to nothing is silent", before: set(), after: set(), want: nil},
		{name: "the first set is all additions, in ID order", before: set(), after: set(c, a, b), want: []Event{added(a), added(b), added(c)}},
		{name: "an unchanged set is silent", before: set(a, b), after: set(a, b), want: nil},
		{name: "a new instance is added", before: set(a), after: set(a, b), want: []Event{added(b)}},
		{name: "a missing instance is removed", before: set(a, b), after: set(b), want: []Event{removed(a)}},
		{name: "removals come before additions", before: set(a, b), after: set(b, c), want: []Event{removed(a), added(c)}},
		{name: "an instance whose address changed is removed then added", before: set(a, b), after: set(aMoved, b), want: []Event{removed(a), added(aMoved)}},
		{name: "everything gone is all removals", before: set(a, b), after: nil, want: []Event{removed(a), removed(b)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Diff(tt.before, tt.after))
		})
	}
}
