package clusterset

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/servedapis"
)

// memberMode is how this server reads a member.
type memberMode string

const (
	// modeFull watches the member's objects.
	modeFull memberMode = "full"
	// modeSummary reads the summaries the member's own mci-apiserver
	// publishes (summaries.go).
	modeSummary memberMode = "summary"
	// modeDiscovering: the member's API discovery has not said yet
	// whether it publishes summaries. Reading it in full mode meanwhile
	// would fail for good with the summary-only identity members hand out
	// (every list forbidden), so nothing is read until it says.
	modeDiscovering memberMode = "discovering"
)

// memberModes are the modes, in the order the metrics list them.
var memberModes = []memberMode{modeFull, modeSummary, modeDiscovering}

// modeOf decides how to read a member from what its discovery answered:
// through its summaries when it serves them, in full mode only when it
// answered that it does not (a definite NotFound), and not yet when it
// could not be asked.
func (m *member) modeOf(served servedapis.Set) memberMode {
	switch {
	case m.local || m.summaryPolicy == SummariesNever:
		return modeFull
	case served.Known(apiExportSummaries) && served.Known(apiClusterSummaries):
		return modeSummary
	case served.Answered(apiExportSummaries) && served.Answered(apiClusterSummaries):
		return modeFull
	}
	return modeDiscovering
}

// The member's discovery is asked again, until it answers, after
// discoveryBackoff (jittered, doubling to its cap), or at once when its
// probe gets through again after failing: a member that could not be
// asked at start is read as soon as it answers, and one whose link was
// down (a replica started during a partition) within a probe interval of
// the link healing, not at the end of a backoff grown while it was down.
// A member whose mode is known is asked again every modeRecheck, so that
// one that installs or removes its mci-apiserver is read in its new mode
// without a restart.
var (
	discoveryBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 10 * time.Second}
	modeRecheck      = time.Minute
)

// followMode keeps member name in the mode its discovery says, for as long
// as m is the member serving it (or its pending replacement): while m is
// discovering it asks with backoff until the member answers; once its
// mode is known it asks every modeRecheck. A member whose answer calls for
// another mode is replaced by one started in that mode, which takes its
// place once it has listed (replaceWhenSynced): until then m keeps serving
// its last known data. Each change is one log line, and the mode is
// exported as mci_clusterset_member_mode.
//
// It runs on a timer, as the member's probes do (probe.go): a goroutine
// that sleeps a minute between rechecks for the member's life would cost
// each member its stack.
func (c *Cache) followMode(name string, m *member) {
	if m.local {
		return
	}
	f := &modeFollower{c: c, name: name, m: m, logger: klog.FromContext(m.ctx).WithValues("member", name), backoff: discoveryBackoff}
	f.wait()
	context.AfterFunc(m.ctx, f.stop)
}

// modeFollower is the state of followMode between its rechecks.
type modeFollower struct {
	c       *Cache
	name    string
	m       *member
	logger  klog.Logger
	backoff wait.Backoff
	rereads int

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// wait schedules the next recheck: after modeRecheck, or the discovery
// backoff while the member is discovering (or the probe gets through
// again, whichever is first), or when a frozen member thaws.
func (f *modeFollower) wait() {
	d := modeRecheck
	discovering := f.m.mode == modeDiscovering
	if discovering {
		d = f.backoff.Step()
	}
	if at := f.m.quota.thawAt(); !at.IsZero() {
		d = min(d, max(time.Until(at), 0))
	}
	var once sync.Once
	recheck := func() { once.Do(f.recheck) }
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	t := time.AfterFunc(d, recheck)
	f.timer = t
	if discovering {
		f.m.gate.whenReopened(func() {
			// The gate's releaser must not block: the recheck, which
			// asks the member's discovery, runs on a timer of its own.
			// A reopen after this wait ended (t fired) is not this
			// wait's.
			f.mu.Lock()
			defer f.mu.Unlock()
			if !f.stopped && t.Stop() {
				f.timer = time.AfterFunc(0, recheck)
			}
		})
	}
}

func (f *modeFollower) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	if f.timer != nil {
		f.timer.Stop()
	}
}

// recheck asks the member's discovery and follows its answer, then waits
// for the next recheck, unless it has handed the member on.
func (f *modeFollower) recheck() {
	if f.m.ctx.Err() != nil {
		return
	}
	if f.follow() {
		f.wait()
	}
}

// follow takes one recheck; it reports whether m is still to be followed.
func (f *modeFollower) follow() bool {
	c, name, m, logger := f.c, f.name, f.m, f.logger
	if !c.serves(name, m) {
		return true
	}
	if _, unknown := m.identity.get(); unknown != "" {
		// Not read when it connected (a transient error, or the
		// permission granted since): asked again at each recheck.
		c.identify(m.ctx, m)
	}
	reason, _, _ := m.quota.state()
	at := m.quota.thawAt()
	thawing := !at.IsZero() && !time.Now().Before(at)
	if m.summaryPolicy == SummariesNever && !thawing {
		return true
	}
	served := m.discover(klog.NewContext(m.ctx, logger))
	next := m.modeOf(served)
	switch {
	case thawing && next != modeDiscovering:
		// Said at the first read again only: a member that stays
		// frozen is read every --member-freeze-retry, and its freeze
		// is said once per change (quota.go).
		logger.V(min(f.rereads, 1)*2).Info("Reading the frozen member again; its last known data is kept until it lists within its limits", "quota", reason, "mode", next)
		f.rereads++
	case next == m.mode || next == modeDiscovering:
		// An unanswered discovery changes nothing: a member read
		// through its summaries stays so while its summary stream
		// retries, one read in full mode stays so.
		return true
	default:
		logger.Info("The member's mode changes", "from", m.mode, "to", next)
	}
	if err := c.remode(name, m, served); err != nil {
		logger.Error(err, "Cannot start the member's informers again; asking again")
		return true
	}
	if !thawing {
		return false
	}
	// A fresh member that freezes while listing is dropped, and this
	// one stays, frozen: it is read again after another FreezeRetry.
	m.quota.rearm(time.Now())
	return true
}

// serves reports whether m is member name's, in use or replacing it. A
// member in use whose replacement (a rotated kubeconfig) is pending is
// not: the replacement follows its own mode.
func (c *Cache) serves(name string, m *member) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.replacing[name] == m || (c.members[name] == m && c.replacing[name] == nil)
}

// remode starts a member from m's kubeconfig in the mode served calls for
// and puts it in m's place once it has listed.
func (c *Cache) remode(name string, m *member, served servedapis.Set) error {
	source, config := m.current()
	n, err := c.newMember(name, source, config)
	if err != nil {
		return err
	}
	n.credentialless = m.credentialless
	n.joined, n.created = m.joined, m.created
	// A fresh read reads the cluster ID afresh: a member refused as a
	// second name is read again after --member-freeze-retry, and serves
	// once the member it shared its cluster with has left.
	c.identify(c.ctx, n)
	n.startWith(c.ctx, c.thresholds(name), served)
	c.followMode(name, n)
	c.dropReplacement(name, n)
	go c.replaceWhenSynced(name, n)
	return nil
}

// noSummaries is the empty lister of a member still discovering.
var noSummaries = summaryLister{indexer: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}), logger: klog.Background()}

// discoveringSynced keeps a member that is still being asked what it
// serves from counting as listed.
func discoveringSynced() bool { return false }

var _ cache.InformerSynced = discoveringSynced
