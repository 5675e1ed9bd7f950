package clusterset

import (
	"sync"

	"k8s.io/klog/v2"
)

// A member read through its summaries is known up to more than the
// objects it holds. A list's resourceVersion covers every change before
// it, deletions included, which no listed object carries; and the
// member's server moves its version with changes that alter no summary (a
// Service or a Pod of an exported pool's namespace that the summary does
// not reflect), which a watcher of the summaries learns only from the
// bookmarks the server sends it. Both say that nothing this replica reads
// of the member changed up to that version, so the member's version is
// raised to it (a KindListed event).
//
// Without it a replica places the member at its newest summary. A
// replica that started after a deletion, or that listed the member after
// such a move, issues versions above that; a watch resumed from one of
// them on a replica that only watched would wait for the member's next
// change, however long the member stays quiet, and be refused.
//
// Only for a member read through its summaries. The member component of a
// summary server's version is the newest change that server has seen, the
// same whichever replica reads it when. A kube-apiserver's version is not:
// it moves with every write to the cluster, so two replicas that listed a
// quiet member a moment apart would be placed at two versions, and a
// watch moving from the later to the earlier would be refused, or wait
// for the member's next change. A member read in full mode (the local
// cluster too) stays at its newest object.

// memberProgress raises a member's version to what every one of its
// informers is known to have handled: the lowest, over the informers, of
// the newest version each has told (its lists', its watch events' and
// bookmarks', in order). Each informer tells it in line, after its
// handler has passed on every change up to that version, so the raise
// comes after them.
type memberProgress struct {
	version func(string) (uint64, error)
	raise   func(uint64)
	logger  klog.Logger

	mu sync.Mutex
	// known is each informer's newest readable version, 0 before its
	// first.
	known []uint64
	// raised is the last version raised.
	raised uint64
	// unreadable is set once a version that cannot be read was logged.
	unreadable bool
}

func newMemberProgress(informers int, version func(string) (uint64, error), raise func(uint64), logger klog.Logger) *memberProgress {
	return &memberProgress{version: version, raise: raise, logger: logger, known: make([]uint64, informers)}
}

// of is what informer i calls with each version it has handled.
func (p *memberProgress) of(i int) func(string) {
	return func(rv string) { p.observe(i, rv) }
}

func (p *memberProgress) observe(i int, rv string) {
	n, err := p.version(rv)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || n == 0 {
		if !p.unreadable {
			p.unreadable = true
			p.logger.V(2).Info("A version of the member's summaries cannot be read; the member's version stays at its newest summary until one can", "resourceVersion", rv, "err", err)
		}
		return
	}
	p.known[i] = max(p.known[i], n)
	lowest := p.known[0]
	for _, k := range p.known[1:] {
		lowest = min(lowest, k)
	}
	if lowest <= p.raised {
		return
	}
	p.raised = lowest
	// Under the lock, so that raises are passed on in their order.
	p.raise(lowest)
}
