package clusterset

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// A member's first lists say more than the objects they hold: their
// resourceVersion covers every change before it, deletions included, which
// no listed object carries. A replica that starts after a member deleted
// something would otherwise place the member at its newest listed object,
// below the deletion that a replica running then saw and put in the
// versions it issued: a watch resumed here from such a version would wait
// for the member's next change, however long the member stays quiet. So
// once the handlers have every object of the first lists of the informers
// the member starts once (every one but those of the namespaces of its
// pools, which start later), the member's version is raised to theirs (a
// KindListed event). The local cluster is a member too: its version is
// what its summaries carry to every other cluster.

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

// listedSource is one informer the member starts once: its handler's
// registration and the record of its first list.
type listedSource struct {
	handler cache.ResourceEventHandlerRegistration
	list    *firstList
}

// firstListOf returns the record of the first list of the member's
// informer of kind, made on first use.
func (m *member) firstListOf(kind Kind) *firstList {
	if m.firstLists == nil {
		m.firstLists = map[Kind]*firstList{}
	}
	if m.firstLists[kind] == nil {
		m.firstLists[kind] = &firstList{}
	}
	return m.firstLists[kind]
}

// addListed counts the informer of kind, whose handler reg is, in what
// the member's version is raised to once listed.
func (m *member) addListed(reg cache.ResourceEventHandlerRegistration, kind Kind) {
	m.listed = append(m.listed, listedSource{handler: reg, list: m.firstListOf(kind)})
}

// listedPoll is how often announceListed looks at the handlers.
const listedPoll = 50 * time.Millisecond

// announceWhenListed raises the member's version to its first lists'
// once they have reached the handlers (announceListed), and counts the
// member as listed only after that, so that the baseline of every Store
// covers it. The versions of a member read in full mode are its
// kube-apiserver's; those of its summaries carry its own as their one
// member component.
func (m *member) announceWhenListed(ctx context.Context, logger klog.Logger) {
	if len(m.listed) == 0 {
		return
	}
	version := memberResourceVersion
	if m.mode == modeSummary {
		version = summaryListVersion
	}
	announced := &atomic.Bool{}
	m.synced = append(m.synced, announced.Load)
	go m.announceListed(ctx, slices.Clone(m.listed), version, announced, logger)
}

// announceListed waits until every source's handler has had its first
// list (and, in full mode, every namespace of the member's pools has
// listed), then raises the member's version to the lowest of the lists'
// versions, read by version. The per-namespace informers start once their
// pools are listed, so their first lists come later than these. It sets
// done either way: a version it cannot read raises nothing, and the
// member's component stays at its newest listed object, as before.
func (m *member) announceListed(ctx context.Context, sources []listedSource, version func(string) (uint64, error), done *atomic.Bool, logger klog.Logger) {
	defer done.Store(true)
	err := wait.PollUntilContextCancel(ctx, listedPoll, true, func(context.Context) (bool, error) {
		for _, s := range sources {
			if s.handler != nil && !s.handler.HasSynced() {
				return false, nil
			}
		}
		return m.poolNamespaces == nil || m.poolNamespaces.hasSynced(), nil
	})
	if err != nil || slices.ContainsFunc(sources, func(s listedSource) bool { return s.handler == nil }) {
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
