package imports

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// importedCluster computes one exporter's status.clusters[] entry: how to
// reach it in its routing mode, and whether it is Ready. An unreachable
// member keeps its last known data but is never Ready.
func importedCluster(e exporter, counter endpointCounter, generation int64) (inference.ImportedCluster, verdict) {
	var (
		entry inference.InferencePoolExportSummaryStatus
		ready verdict
	)
	if e.summary != nil {
		entry, ready = summaryEntry(e.member.Name, e.summary)
	} else {
		entry, ready = clusterEntry(e, counter)
	}
	ic := inference.ImportedCluster{
		Name:             e.member.Name,
		RoutingMode:      entry.RoutingMode,
		TargetPortNumber: entry.TargetPortNumber,
		Parents:          entry.Parents,
		// The entry owns the list: summaryEntry and clusterEntry
		// build it anew.
		EndpointAddresses: entry.EndpointAddresses,
	}
	if entry.EndpointPicker != nil {
		ic.EndpointPicker = *entry.EndpointPicker
	}
	settings := e.settings(entry)
	ic.ExportSettings = settings.settings
	if u := e.member.Unreachable; u != nil && ready.reason != v1alpha1.ReasonInvalidExport {
		// An unreachable member's last known EPP stays a candidate for
		// sidecars; an invalid export never had one.
		ready = unreachableVerdict(e.member.Name, u, ready)
	}
	ic.Conditions = []metav1.Condition{ready.condition(v1alpha1.ConditionReady, generation)}
	if e.valid() {
		m := e.meta()
		if c, ok := drainCondition(e.member, e.draining, m.Namespace, m.Name, generation); ok {
			ic.Conditions = append(ic.Conditions, c)
		}
	}
	if c := settings.condition(generation); c != nil {
		ic.Conditions = append(ic.Conditions, *c)
	}
	return ic, ready
}

// targetPortNumber is the pool's first target port, 0 when it has none.
func targetPortNumber(pool *poolv1.InferencePool) int32 {
	if len(pool.Spec.TargetPorts) == 0 {
		return 0
	}
	return pool.Spec.TargetPorts[0].Number
}

// unreachableVerdict flags a member whose watches are down: its data is
// served as last known, and the message says what that data said.
func unreachableVerdict(cluster string, u *Unreachable, lastKnown verdict) verdict {
	msg := u.Describe(cluster)
	if u.Message != "" {
		msg += ": " + u.Message
	}
	msg += fmt.Sprintf("; serving its last known data, by which it was %s (%s)", readyWord(lastKnown.ok), lastKnown.message)
	return verdict{reason: u.Reason(), message: msg}
}

func readyWord(ok bool) string {
	if ok {
		return "ready"
	}
	return "not ready"
}
