package discovery

import (
	"fmt"
	"maps"
	"slices"
)

// Diff returns the events that turn the ready set before into the ready set
// after, both keyed by instance ID: removals first, then additions, each in
// ID order so that a stream is reproducible. An instance present in both
// whose details changed (a pod recreated under the same name with a new
// address) is removed and added again, since a consumer keyed by ID must
// replace what it holds.
func Diff(before, after map[string]Instance) []Event {
	var removed, added []Event
	for _, id := range slices.Sorted(maps.Keys(before)) {
		old := before[id]
		if cur, ok := after[id]; !ok || cur != old {
			removed = append(removed, Event{Type: InstanceRemoved, Instance: old})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(after)) {
		cur := after[id]
		if old, ok := before[id]; !ok || old != cur {
			added = append(added, Event{Type: InstanceAdded, Instance: cur})
		}
	}
	return append(removed, added...)
}

// sortedInstances returns the instances of a ready set in ID order.
func sortedInstances(set map[string]Instance) []Instance {
	out := make([]Instance, 0, len(set))
	for _, id := range slices.Sorted(maps.Keys(set)) {
		out = append(out, set[id])
	}
	return out
}

func (t EventType) String() string {
	switch t {
	case InstanceAdded:
		return "InstanceAdded"
	case InstanceRemoved:
		return "InstanceRemoved"
	default:
		return fmt.Sprintf("EventType(%d)", int(t))
	}
}
