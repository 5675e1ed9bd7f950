package soak

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// How a member's name stops resolving without a DNS query leaving the
// machine: the named member Secret names its member by a host name
// under the reserved .test domain and sets proxy-url to the soak's name
// proxy (localclusterset.NameProxy), which resolves it from a table the
// soak holds. The watcher's replicas hand the name to the proxy as it is,
// so nothing on the machine ever asks DNS for it: Go resolves a name
// itself only when it dials it, and they dial the proxy's loopback
// address. Go refuses to look up only .onion names without a query
// (.invalid and .test go to the resolver), and the soak cannot change the
// machine's resolver, so a name that fails under the soak's control is
// the proxy's. What the replicas see is what a client behind a proxy sees
// when a lookup fails (502 Bad Gateway on CONNECT), and mci treats it as
// it treats a lookup failure: a member that does not answer.

// memberName is the host name the named member Secret gives its member.
func memberName(member string) string { return member + ".members.mci-soak.test" }

// probeInterval is mci-apiserver's probe interval of a reachable member
// (pkg/clusterset): a member that stops answering is flagged within one
// probe interval of its unreachable threshold.
const probeInterval = time.Second

// failName makes Target's name, as Watcher's member Secret gives it, stop
// resolving (its tunnels cut, as when the member's address moves while its
// record is gone) and checks that Watcher flags the member unreachable
// within its threshold and a probe interval with its pools kept; it
// returns what makes the name resolve again.
func (in *injector) failName(ctx context.Context, f fault) (func() error, error) {
	name := memberName(f.Target)
	ip, ok := in.named.resolved()
	if !ok {
		return nil, fmt.Errorf("%s does not resolve before the fault", name)
	}
	before, err := in.entriesOf(ctx, f.Watcher, f.Target)
	if err != nil {
		return nil, err
	}
	in.w.fault(f.Watcher, f.Target, 1)
	in.named.names.Unresolve(name)
	failed := time.Now()
	heal := func() error {
		in.named.names.Resolve(name, ip)
		in.w.fault(f.Watcher, f.Target, -1)
		return nil
	}
	in.record(f.ID, in.checkFlagged(ctx, f, failed, before))
	return heal, nil
}

// entriesOf lists the imports in which watcher's fresh LIST has an entry
// of member.
func (in *injector) entriesOf(ctx context.Context, watcher, member string) (map[string]string, error) {
	imps, err := listImports(ctx, in.mci[watcher])
	if err != nil {
		return nil, fmt.Errorf("listing %s's imports: %w", watcher, err)
	}
	out := map[string]string{}
	for _, imp := range imps {
		for _, c := range imp.Status.Clusters {
			if c.Name != member {
				continue
			}
			out[imp.Namespace+"/"+imp.Name] = ""
			for _, cond := range c.Conditions {
				if cond.Type == "Ready" {
					out[imp.Namespace+"/"+imp.Name] = cond.Reason
				}
			}
		}
	}
	return out, nil
}

// checkFlagged waits until every import of Watcher that had an entry of
// Target before the fault still has it, flagged ClusterUnreachable: the
// pools are kept (the documented rule keeps them until
// --member-remove-after) and flagged. Bound: the unreachable threshold and
// one probe interval from the name's failure.
func (in *injector) checkFlagged(ctx context.Context, f fault, failed time.Time, before map[string]string) check {
	bound := unreachableAfter + probeInterval
	c := check{Target: fmt.Sprintf("#%d %s %s: %s keeps its %d imports' entries of %s, flagged %s, within %s", f.ID, f.Kind, f.Target, f.Watcher, len(before), f.Target, v1alpha1.ReasonClusterUnreachable, bound)}
	if len(before) == 0 {
		c.Figure = "no entry of the member before the fault"
		return c
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, f.Hold, true, func(ctx context.Context) (bool, error) {
		now, err := in.entriesOf(ctx, f.Watcher, f.Target)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for key := range before {
			reason, kept := now[key]
			switch {
			case !kept:
				last = key + " lost its entry"
				return false, nil
			case reason != v1alpha1.ReasonClusterUnreachable:
				last = fmt.Sprintf("%s: %s", key, reason)
				return false, nil
			}
		}
		return true, nil
	})
	took := time.Since(failed)
	if err != nil {
		c.Figure = fmt.Sprintf("not in %s: %s", took.Round(100*time.Millisecond), last)
		return c
	}
	c.OK = took <= bound
	c.Figure = fmt.Sprintf("flagged %.2fs after the name failed, every entry kept", took.Seconds())
	return c
}
