package clusterset

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/imports"
)

// Limits bound what one member other than the local cluster may make this
// server hold and do: a member is a trust boundary, and one that sends
// without bound (a runaway controller, a compromised cluster) would
// otherwise take every replica's memory, and with it the APIService that
// every cluster's discovery, namespace deletion and garbage collection
// depend on. A member that exceeds one is frozen (quota.go).
type Limits struct {
	// Objects the member's caches may hold: its summaries in summary
	// mode; its InferencePools, Namespaces, Gateways, BackendTLSPolicies
	// and the Services and EndpointSlices of its pools' namespaces in full
	// mode.
	Objects int
	// Bytes those objects may take, as encoded once trimmed (JSON, or
	// Kubernetes' protobuf for its own types), before the summaries'
	// compression: a summary that compresses well still costs its full
	// size on each read.
	Bytes int64
	// Namespaces the member may list (its cluster summary's, in summary
	// mode).
	Namespaces int
	// EventsPerSecond is the sustained rate of changes the member may
	// send, with bursts of EventBurst; a relist's unchanged objects do
	// not count.
	EventsPerSecond float64
	EventBurst      int
	// ResponseBytes caps the body of each response from the member: a
	// list, a discovery answer, or a watch stream (which is then resumed
	// on a new request, as after any broken watch).
	ResponseBytes int64
	// FreezeRetry is how long a frozen member stays frozen before a fresh
	// member reads it again (taking its place only if it lists within
	// these limits).
	FreezeRetry time.Duration
}

// DefaultLimits suit a large fleet: a member with thousands of exported
// pools and ten thousand namespaces stays well within them, while a
// single member cannot take more than a fraction of the 512 MiB the
// chart gives mci-apiserver. The change rate is for a runaway member, not
// a busy one: a sync that applies ten thousand pools at once (the e2e
// scale test creates them at about 400 a second) must not freeze it.
var DefaultLimits = Limits{
	Objects:         50000,
	Bytes:           64 << 20,
	Namespaces:      10000,
	EventsPerSecond: 1000,
	EventBurst:      20000,
	ResponseBytes:   64 << 20,
	FreezeRetry:     5 * time.Minute,
}

// The quotas, as the metrics and logs name them.
const (
	quotaObjects    = "objects"
	quotaBytes      = "bytes"
	quotaNamespaces = "namespaces"
	quotaEventRate  = "eventRate"
	quotaResponse   = "responseBytes"
	// quotaIdentity: the member is another member's cluster under a
	// second name: its cluster ID is that member's (identity.go), or its
	// cluster summary names another cluster.
	quotaIdentity = "identity"
	// quotaResourceVersion: the member sent a resourceVersion this server
	// cannot order (resourceVersion.go).
	quotaResourceVersion = "resourceVersion"
)

var quotaNames = []string{quotaObjects, quotaBytes, quotaNamespaces, quotaEventRate, quotaResponse, quotaIdentity, quotaResourceVersion}

// quota tracks what a member holds and sends against its Limits, and
// freezes it at the first one it exceeds: its informers stop (nothing it
// sends is applied any more, and nothing more is held), its events are no
// longer passed on, and its last known data is served flagged, as a
// member that cannot be reached. A frozen member is read again when it is
// reconnected (a changed kubeconfig) or, after Limits.FreezeRetry, by a fresh
// member that takes its place only if it lists within its limits.
type quota struct {
	limits Limits

	mu sync.Mutex
	// stop stops the member's informers.
	stop  func()
	sizes map[string]int64
	bytes int64
	// held is what sizes and bytes hold of each kind, and heldIn of each
	// kind in each namespace: a list of a kind replaces what it held of
	// the kind, in all namespaces or in the list's one (listing).
	held       map[Kind]listCount
	heldIn     map[kindIn]listCount
	namespaces int
	events     flowcontrol.RateLimiter
	// frozen is the quota the member exceeded, "" while it has not.
	frozen  string
	since   time.Time
	message string
	// retryAt is when a fresh member reads the frozen member again.
	retryAt time.Time
	// exceeded counts freezes by quota, for the metrics.
	exceeded map[string]uint64
}

func newQuota(limits Limits) *quota {
	q := &quota{limits: limits, sizes: map[string]int64{}, held: map[Kind]listCount{}, heldIn: map[kindIn]listCount{}, exceeded: map[string]uint64{}}
	if limits.EventsPerSecond > 0 {
		q.events = flowcontrol.NewTokenBucketRateLimiter(float32(limits.EventsPerSecond), max(limits.EventBurst, 1))
	}
	return q
}

// kindIn is a kind in one namespace ("" for cluster-scoped objects).
type kindIn struct {
	kind      Kind
	namespace string
}

// object records a change of the object namespace/name of kind, of
// encoded size size (0: it was deleted); changed says whether it is a
// change the member sent rather than one its initial list or a relist
// replayed. It reports the reason to freeze the member, "" when within its
// limits.
func (q *quota) object(kind Kind, namespace, name string, size int64, changed bool) (string, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.frozen != "" {
		return "", ""
	}
	key := kind.String() + "/" + namespace + "/" + name
	old, had := q.sizes[key]
	q.bytes += size - old
	objects := 0
	switch {
	case size == 0 && had:
		delete(q.sizes, key)
		objects = -1
	case size != 0:
		q.sizes[key] = size
		if !had {
			objects = 1
		}
	}
	q.held[kind] = q.held[kind].plus(objects, size-old)
	in := kindIn{kind, namespace}
	if h := q.heldIn[in].plus(objects, size-old); h.objects > 0 {
		q.heldIn[in] = h
	} else {
		delete(q.heldIn, in)
	}
	if reason, msg := q.over(len(q.sizes), q.bytes); reason != "" {
		return reason, msg
	}
	if changed && q.events != nil && !q.events.TryAccept() {
		return quotaEventRate, fmt.Sprintf("it sends more than %g changes a second, in bursts of more than %d (--member-max-event-rate, --member-max-event-burst)", q.limits.EventsPerSecond, q.limits.EventBurst)
	}
	return "", ""
}

// listing reports the reason to freeze a member whose list of kind (a
// plain list's pages, or a streaming list's initial events) in namespace
// ("": of all namespaces) has brought listed so far: what the member
// would hold once the list replaced what it holds of kind there.
func (q *quota) listing(kind Kind, namespace string, listed listCount) (string, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.frozen != "" {
		return "", ""
	}
	h := q.held[kind]
	if namespace != "" {
		h = q.heldIn[kindIn{kind, namespace}]
	}
	return q.over(len(q.sizes)-h.objects+listed.objects, q.bytes-h.bytes+listed.bytes)
}

// over reports the objects or bytes limit that objects objects of bytes
// bytes pass, "" when none.
func (q *quota) over(objects int, bytes int64) (string, string) {
	switch {
	case q.limits.Objects > 0 && objects > q.limits.Objects:
		return quotaObjects, fmt.Sprintf("it holds more than %d objects (--member-max-objects)", q.limits.Objects)
	case q.limits.Bytes > 0 && bytes > q.limits.Bytes:
		return quotaBytes, fmt.Sprintf("its objects take more than %d bytes (--member-max-bytes)", q.limits.Bytes)
	}
	return "", ""
}

// namespaceCount records how many namespaces the member lists.
func (q *quota) namespaceCount(n int) (string, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.namespaces = n
	if q.frozen == "" && q.limits.Namespaces > 0 && n > q.limits.Namespaces {
		return quotaNamespaces, fmt.Sprintf("it lists more than %d namespaces (--member-max-namespaces)", q.limits.Namespaces)
	}
	return "", ""
}

// freeze stops the member at the quota it exceeded; it reports whether
// this call froze it (a member is frozen once).
func (q *quota) freeze(reason, message string, now time.Time) bool {
	q.mu.Lock()
	if q.frozen != "" {
		q.mu.Unlock()
		return false
	}
	q.frozen, q.since, q.message, q.retryAt = reason, now, message, now.Add(q.retry())
	q.exceeded[reason]++
	stop := q.stop
	q.mu.Unlock()
	if stop != nil {
		stop()
	}
	return true
}

// onFreeze makes stop what stops the member's informers when it freezes,
// and calls it now if it is frozen already (a discovery answer over its
// cap). A nil quota (the local cluster) never freezes.
func (q *quota) onFreeze(stop func()) {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.stop = stop
	frozen := q.frozen != ""
	q.mu.Unlock()
	if frozen {
		stop()
	}
}

// rearm restarts the freeze's clock: the member is read again only after
// another FreezeRetry.
func (q *quota) rearm(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.frozen != "" {
		q.retryAt = now.Add(q.retry())
	}
}

// thawAt is when a frozen member is read again; zero when it is not
// frozen.
func (q *quota) thawAt() time.Time {
	if q == nil {
		return time.Time{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.frozen == "" {
		return time.Time{}
	}
	return q.retryAt
}

// state is the quota the member is frozen at, "" when it is not, and
// since when and why.
func (q *quota) state() (reason string, since time.Time, message string) {
	if q == nil {
		return "", time.Time{}, ""
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.frozen, q.since, q.message
}

func (q *quota) exceededCount(reason string) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.exceeded[reason]
}

// objectSize is the encoded size of an object as a cache keeps it.
func objectSize(obj interface{}) int64 {
	switch o := obj.(type) {
	case *compactSummary:
		return int64(o.size + len(o.resourceVersion))
	case interface{ Size() int }:
		// The protobuf size of Kubernetes' own types: no encoding.
		return int64(o.Size())
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return 0
	}
	return int64(len(data))
}

// admit accounts for a change of the member's object of kind, and freezes
// the member when it exceeds a limit; it reports whether the change may
// be passed on (the member is not frozen).
func (m *member) admit(kind Kind, namespace, name string, obj interface{}, deleted, changed bool) bool {
	if m.quota == nil {
		return true
	}
	var size int64
	if !deleted {
		size = max(objectSize(obj), 1)
	}
	if reason, msg := m.quota.object(kind, namespace, name, size, changed); reason != "" {
		m.freeze(reason, msg)
	}
	return !m.frozen()
}

// admitNamespaces accounts for the number of namespaces the member lists.
func (m *member) admitNamespaces(n int) bool {
	if m.quota == nil {
		return true
	}
	if reason, msg := m.quota.namespaceCount(n); reason != "" {
		m.freeze(reason, msg)
	}
	return !m.frozen()
}

// freeze freezes the member and tells the handler, so that its imports
// say so. It is logged once per change: a member read again after
// --member-freeze-retry that freezes for the same reason is not logged
// again (the Cache's freezeLog, which a member that is read again within
// its limits clears).
func (m *member) freeze(reason, message string) {
	if m.quota == nil || !m.quota.freeze(reason, message, time.Now()) {
		return
	}
	if m.freezeLog == nil || m.freezeLog.Observe(m.name, reason, message).Loud() {
		msg := "Member frozen: it exceeds a limit; its last known data is served, flagged, and nothing more it sends is applied until it is read again"
		if reason == quotaIdentity {
			msg = "Member frozen: it speaks for another cluster; nothing it sent is served, and it is flagged until it is read again"
		}
		klog.Background().Error(nil, msg, "member", m.name, "quota", reason, "reason", message, "retryAfter", m.quota.retry())
	}
	m.handler(Event{Member: m.name, Kind: KindMember})
}

func (m *member) frozen() bool {
	if m.quota == nil {
		return false
	}
	reason, _, _ := m.quota.state()
	return reason != ""
}

// frozenFlag is the flag a frozen member's view carries, merged into its
// unreachability: importers show it as ClusterUnreachable, with what the
// member exceeded.
func (m *member) frozenFlag(u *imports.Unreachable) *imports.Unreachable {
	if m.quota == nil {
		return u
	}
	reason, since, message := m.quota.state()
	if reason == "" {
		return u
	}
	msg := fmt.Sprintf("frozen since %s: %s; its last known data is kept and nothing more it sends is applied", since.UTC().Format(time.RFC3339), message)
	if u == nil {
		return &imports.Unreachable{Since: since, Message: msg}
	}
	flagged := *u
	flagged.Message += "; " + msg
	return &flagged
}

// retry is how long the member stays frozen before it is read again.
func (q *quota) retry() time.Duration {
	if q.limits.FreezeRetry > 0 {
		return q.limits.FreezeRetry
	}
	return DefaultLimits.FreezeRetry
}

// responseTooLarge freezes the member at a response over its cap: it
// would never list within it.
func (m *member) responseTooLarge(err error) {
	m.freeze(quotaResponse, err.Error())
}
