package app

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/mci-dev/mci/pkg/clusterset"
)

// addMemberLimitFlags adds the flags of what each member other than the
// local cluster may make this server hold (docs/membership.md, Limits).
func addMemberLimitFlags(fs *pflag.FlagSet, l *clusterset.Limits) {
	const frozen = " A member that exceeds it is frozen: its last known data is served, flagged ClusterUnreachable, and nothing more it sends is applied until it is read again (--member-freeze-retry)."
	fs.IntVar(&l.Objects, "member-max-objects", l.Objects, "Objects this server may hold of one member: its summaries in summary mode; its InferencePools, Namespaces, Gateways, BackendTLSPolicies and the Services and EndpointSlices of its pools' namespaces in full mode."+frozen)
	fs.Int64Var(&l.Bytes, "member-max-bytes", l.Bytes, "Bytes those objects of one member may take, as encoded once trimmed."+frozen)
	fs.IntVar(&l.Namespaces, "member-max-namespaces", l.Namespaces, "Namespaces one member may list (its cluster summary's in summary mode)."+frozen)
	fs.Float64Var(&l.EventsPerSecond, "member-max-event-rate", l.EventsPerSecond, "Changes a second one member may send, sustained (an initial list or a relist's unchanged objects do not count)."+frozen)
	fs.IntVar(&l.EventBurst, "member-max-event-burst", l.EventBurst, "Changes one member may send in a burst above --member-max-event-rate."+frozen)
	fs.Int64Var(&l.ResponseBytes, "member-max-response-bytes", l.ResponseBytes, "Bytes of one response from a member (a list, a discovery answer, a probe); a watch that has carried that many is ended and resumed. A list or answer over it freezes the member.")
	fs.DurationVar(&l.FreezeRetry, "member-freeze-retry", l.FreezeRetry, "How long a frozen member stays frozen before it is read again; the fresh read takes the frozen one's place only if it lists within the limits.")
}

func validateMemberLimits(l clusterset.Limits) []error {
	var errs []error
	for _, f := range []struct {
		flag, need string
		ok         bool
	}{
		{"--member-max-objects", "positive", l.Objects > 0},
		{"--member-max-bytes", "positive", l.Bytes > 0},
		{"--member-max-namespaces", "positive", l.Namespaces > 0},
		{"--member-max-event-rate", "positive", l.EventsPerSecond > 0},
		{"--member-max-event-burst", "positive", l.EventBurst > 0},
		// A watch ended at the cap must have carried one whole event,
		// which client-go allows up to 16 MiB, or it would be resumed
		// into the same event for ever.
		{"--member-max-response-bytes", "at least 16 MiB (16777216), the most client-go reads of one watch event", l.ResponseBytes >= 16<<20},
		{"--member-freeze-retry", "positive", l.FreezeRetry > 0},
	} {
		if !f.ok {
			errs = append(errs, fmt.Errorf("%s must be %s", f.flag, f.need))
		}
	}
	return errs
}
