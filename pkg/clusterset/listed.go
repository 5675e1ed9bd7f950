package clusterset

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// A member's first lists say more than the objects they hold: their
// resourceVersion covers every change before it, deletions included, which
// no listed object carries. A replica that starts after a member deleted
// something would otherwise place the member at its newest listed object,
// below the deletion that a replica running then saw and put in the
// versions it issued: a watch resumed here from such a version would wait
// for the member's next change, however long the member stays quiet. So
// once the handlers have every object of the first lists, the member's
// version is raised to theirs (a KindListed event).
//
// Only for a member read through its summaries. The member component of a
// list of summaries is the newest change the member's own server has
// seen, the same whichever replica reads it when. A kube-apiserver's
// list version is not: it moves with every write to the cluster, so two
// replicas that listed a quiet member a moment apart would be placed at
// two versions, and a watch moving from the later to the earlier would be
// refused, or wait for the member's next change. A member read in full
// mode (the local cluster too) stays at its newest listed object.

// firstList records the resourceVersion of an informer's first complete
// list (a paged list, or a streaming list's closing bookmark). Later
// lists are not recorded: only the first is known to have reached the
// handlers once the handler's registration has synced.
type firstList struct{ rv atomic.Pointer[string] }

func (f *firstList) record(rv string) {
	if f != nil && rv != "" {
		f.rv.CompareAndSwap(nil, &rv)
	}
}

func (f *firstList) version() string {
	if p := f.rv.Load(); p != nil {
		return *p
	}
	return ""
}

// listedSource is one informer of a member: whether its handler has had
// its first list, and the record of that list.
type listedSource struct {
	synced func() bool
	list   *firstList
}

// listedPoll is how often announceListed looks at the handlers.
const listedPoll = 50 * time.Millisecond

// announceListed waits until every source's handler has had its first
// list, then raises the member's version to the lowest of the lists'
// versions, read by version (a summary's member component). It sets
// done either way: a version it cannot read raises nothing, and the
// member's component stays at its newest listed object, as before.
func (m *member) announceListed(ctx context.Context, sources []listedSource, version func(string) (uint64, error), done *atomic.Bool, logger klog.Logger) {
	defer done.Store(true)
	err := wait.PollUntilContextCancel(ctx, listedPoll, true, func(context.Context) (bool, error) {
		for _, s := range sources {
			if s.synced != nil && !s.synced() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil || slices.ContainsFunc(sources, func(s listedSource) bool { return s.synced == nil }) {
		return
	}
	var lowest uint64
	for i, s := range sources {
		n, err := version(s.list.version())
		if err != nil || n == 0 {
			logger.V(2).Info("The version of the member's first list cannot be read; its version stays at the newest object listed", "resourceVersion", s.list.version(), "err", err)
			return
		}
		if i == 0 || n < lowest {
			lowest = n
		}
	}
	m.handler(Event{Member: m.name, Kind: KindListed, ResourceVersion: lowest})
}
