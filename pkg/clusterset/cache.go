package clusterset

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/statelog"
)

// Options configure a Cache.
type Options struct {
	// ClusterSetName names the ClusterSet (it seeds virtual objects' uids).
	ClusterSetName string
	// LocalName is the name of the cluster this server serves.
	LocalName string
	// Local is the connection to the local cluster.
	Local *rest.Config
	// UnreachableAfter is how long a member may fail its probes before it
	// is flagged ClusterUnreachable.
	UnreachableAfter time.Duration
	// RemoveAfter is how long a member other than the local cluster may
	// fail its probes before the pools it exported are no longer served;
	// 0 never.
	RemoveAfter time.Duration
	// Summaries says whether members are read through the summaries their
	// own mci-apiservers publish when they do (SummariesAuto, the default
	// when empty) or always through their objects (SummariesNever).
	Summaries Summaries
	// Limits bound what each member other than the local cluster may make
	// this server hold (quota.go); DefaultLimits when zero.
	Limits Limits
}

// Cache holds one member per cluster of the ClusterSet, the local cluster
// included, and tells its handler about every change.
type Cache struct {
	opts    Options
	handler Handler
	ctx     context.Context

	mu      sync.RWMutex
	members map[string]*member
	// metas are each member's labels and drain as its membership source
	// has them (desiredMembers.metas), the local cluster's included.
	metas map[string]memberMeta
	// replacing are members reconnected with a new kubeconfig (rotated
	// credentials) that have not listed yet; members keeps the one they
	// replace until they have.
	replacing map[string]*member
	// sorted is the members sorted by name, rebuilt when membership changes.
	sorted []*member
	// unreported are the membership sources that have not reported yet,
	// and joining the members being started for the first time (asking
	// what they serve, which a partitioned member makes slow): until
	// neither has any, the Cache does not know every member, so it is not
	// ready (see Ready for the bound).
	unreported map[string]bool
	joining    map[string]*member

	// ids are the members' cluster IDs (identity.go).
	ids identities
	// freezeLog says each member's freeze once per change (quota.go).
	freezeLog statelog.Log[string]
}

// New returns a Cache; Run starts it.
func New(opts Options, handler Handler) *Cache {
	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits
	}
	return &Cache{opts: opts, handler: handler, members: map[string]*member{}, replacing: map[string]*member{}, joining: map[string]*member{}}
}

// LocalName is the name of the local cluster.
func (c *Cache) LocalName() string { return c.opts.LocalName }

// Run connects to the local cluster and keeps the members in line with
// the membership sources until ctx ends.
func (c *Cache) Run(ctx context.Context, sources ...Source) error {
	c.mu.Lock()
	c.ctx = ctx
	c.unreported = map[string]bool{}
	for _, s := range sources {
		c.unreported[s.Name()] = true
	}
	c.mu.Unlock()
	if err := c.setMember(c.opts.LocalName, "local", MemberConfig{rest: c.opts.Local}); err != nil {
		return fmt.Errorf("connecting to the local cluster: %w", err)
	}
	desired := newDesiredMembers(c.opts.LocalName)
	// Sources report from their own goroutines; membership changes are
	// applied one report at a time.
	var membership sync.Mutex
	for _, s := range sources {
		go s.Run(ctx, func(src string, configs map[string]MemberConfig) {
			membership.Lock()
			defer membership.Unlock()
			for _, change := range desired.update(src, configs) {
				c.apply(ctx, change)
			}
			c.setMetas(desired.metas())
			c.mu.Lock()
			delete(c.unreported, src)
			c.mu.Unlock()
		})
	}
	<-ctx.Done()
	c.mu.Lock()
	members := c.sorted
	for _, m := range c.replacing {
		members = append(members, m)
	}
	c.members, c.sorted, c.replacing = map[string]*member{}, nil, map[string]*member{}
	c.mu.Unlock()
	for _, m := range members {
		m.stop()
	}
	return nil
}

func (c *Cache) apply(ctx context.Context, ch change) {
	logger := klog.FromContext(ctx).WithValues("member", ch.name)
	if ch.config == nil {
		logger.Info("Member left the ClusterSet")
		c.removeMember(ch.name)
		return
	}
	if ch.err != nil {
		logger.Error(ch.err, "Ignoring member with an invalid kubeconfig", "source", ch.source)
		return
	}
	logger.Info("Member joined the ClusterSet", "source", ch.source)
	if err := c.setMember(ch.name, ch.source+"#"+ch.config.fingerprint, *ch.config); err != nil {
		logger.Error(err, "Cannot connect to member")
	}
}

// setMember starts (or restarts, when its source changed) one member
// from mc (its rest configuration, when its Secret or ClusterProfile was
// created, and its fingerprint without the token).
func (c *Cache) setMember(name, source string, mc MemberConfig) error {
	c.mu.RLock()
	old, replacing, ctx := c.members[name], c.replacing[name], c.ctx
	c.mu.RUnlock()
	if old != nil {
		if inUse, _ := old.current(); inUse == source {
			// Back to the source in use: a replacement still listing is moot.
			c.dropReplacement(name, nil)
			return nil
		}
		if c.rotateInPlace(ctx, old, source, mc) {
			return nil
		}
	}
	if replacing != nil {
		if pending, _ := replacing.current(); pending == source {
			return nil
		}
	}
	m, err := c.newMember(name, source, mc.rest)
	if err != nil {
		return err
	}
	m.credentialless = mc.credentialless
	// Starting asks the member what it serves, which a hung member makes
	// slow: never under the lock that every request's snapshot takes.
	m.joined = time.Now()
	m.created = mc.created
	if old == nil {
		c.mu.Lock()
		c.joining[name] = m
		c.mu.Unlock()
	}
	// Its cluster ID first: a member refused as a second name for
	// another's cluster starts frozen, so nothing of it is ever served.
	c.identify(ctx, m)
	m.start(ctx, c.thresholds(name))
	c.followMode(name, m)
	if old == nil {
		c.mu.Lock()
		delete(c.joining, name)
		c.members[name] = m
		c.resort()
		c.mu.Unlock()
		c.handler(Event{Member: name, Kind: KindMember, Replaced: true})
		return nil
	}
	// A reconnected member (rotated credentials) replaces the old one only
	// once it has listed, so its imports do not flap while its cache
	// fills; however long it cannot list (the member is partitioned, or
	// the new credentials do not work), the old one keeps serving the
	// member's last known data, flagged by its own probe if it fails too.
	// Swapping in a replacement that has listed nothing would drop every
	// pool the member exports.
	c.dropReplacement(name, m)
	go c.replaceWhenSynced(name, m)
	return nil
}

// rotateInPlace gives member m the inline credentials of mc when they are
// all that changed in its kubeconfig (a rotated Secret): its bearer
// token, its client certificate and key, its CA bundle, in any
// combination. client-go sends the new token with every request from then
// on, over the connections in use; a new certificate or CA comes with a
// new base transport, whose connections present and verify them, while
// the requests in flight go on over the old one (credentials.rotate). The
// member's watches go on and nothing is listed again. A watch already
// open is not authenticated again by the member's kube-apiserver; when it
// ends, the reflector resumes it from its last resourceVersion with the
// new credentials. Any other change (server, a token or certificate file,
// a plugin, another way to authenticate), or credentials the member does
// not accept, or a CA that does not verify the member, reconnects the
// member (setMember). A frozen member is read afresh at any change.
func (c *Cache) rotateInPlace(ctx context.Context, m *member, source string, mc MemberConfig) bool {
	if mc.credentialless == "" || mc.credentialless != m.credentialless || m.frozen() {
		return false
	}
	// New credentials that the member does not accept (a typo, another
	// cluster's), or a CA that does not verify its serving certificate,
	// must not replace what works: the member is reconnected instead, and
	// the connection in use serves until the new one lists.
	if err := acceptsCredentials(ctx, mc.rest); err != nil {
		klog.FromContext(ctx).Info("Member's new credentials are not accepted yet: connecting with them beside the connection in use, which serves until the new one lists", "member", m.name, "err", err)
		return false
	}
	_, inUse := m.current()
	if !m.credentials.rotate(mc.rest) {
		return false
	}
	// A replacement still listing was for another change, now undone.
	c.dropReplacement(m.name, nil)
	m.rotatedMu.Lock()
	m.rotated = &rotation{source: source, config: rest.CopyConfig(mc.rest)}
	m.rotatedMu.Unlock()
	klog.FromContext(ctx).Info("Member's credentials rotated in place: its connections and watches go on with the new ones", "member", m.name, "source", source, "changed", rotatedParts(inUse, mc.rest))
	return true
}

// rotatedParts names what of a member's inline credentials changed.
func rotatedParts(prev, next *rest.Config) []string {
	var parts []string
	if prev.BearerToken != next.BearerToken {
		parts = append(parts, "token")
	}
	if !bytes.Equal(prev.CertData, next.CertData) || !bytes.Equal(prev.KeyData, next.KeyData) {
		parts = append(parts, "client-certificate")
	}
	if !bytes.Equal(prev.CAData, next.CAData) {
		parts = append(parts, "certificate-authority")
	}
	return parts
}

// acceptsCredentials asks the member, over a connection of its own,
// whether it accepts config's credentials: the TLS handshake verifies the
// member's serving certificate against config's CA, and a bearer token or
// client certificate the member refuses is answered 401 even on /readyz.
func acceptsCredentials(ctx context.Context, config *rest.Config) error {
	config = rest.CopyConfig(config)
	config.Timeout = probeTimeout
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	return client.Discovery().RESTClient().Get().AbsPath("/readyz").MaxRetries(0).Do(ctx).Error()
}

// newMember builds member name as this Cache reads it.
func (c *Cache) newMember(name, source string, config *rest.Config) (*member, error) {
	local := name == c.opts.LocalName
	limits := c.opts.Limits
	if local {
		limits = Limits{}
	}
	m, err := newMember(name, source, config, limits.ResponseBytes, c.handler)
	if err != nil {
		return nil, err
	}
	m.local = local
	m.summaryPolicy = c.opts.Summaries
	m.freezeLog = &c.freezeLog
	if !local {
		m.quota = newQuota(limits)
	}
	return m, nil
}

// replaceWhenSynced puts m in the place of the member it replaces once it
// has listed, unless it was dropped (superseded, removed, shut down) or
// froze while listing (it exceeds its limits): then the member it was to
// replace goes on serving.
func (c *Cache) replaceWhenSynced(name string, m *member) {
	if err := wait.PollUntilContextCancel(m.ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		return m.hasSynced() || m.frozen(), nil
	}); err != nil {
		return
	}
	c.mu.Lock()
	if c.replacing[name] != m {
		c.mu.Unlock()
		return
	}
	if m.frozen() {
		delete(c.replacing, name)
		c.mu.Unlock()
		m.stop()
		return
	}
	delete(c.replacing, name)
	old := c.members[name]
	c.members[name] = m
	c.resort()
	c.mu.Unlock()
	if old != nil {
		old.stop()
	}
	if was, lasted := c.freezeLog.Clear(name); was {
		klog.FromContext(m.ctx).Info("Member read again within its limits: it is no longer frozen", "member", name, "frozenFor", lasted.Round(time.Second))
	}
	c.handler(Event{Member: name, Kind: KindMember, Replaced: true})
}

// dropReplacement stops the replacement of member name that is still
// listing, if any, and records next (nil: none) in its place.
func (c *Cache) dropReplacement(name string, next *member) {
	c.mu.Lock()
	prev := c.replacing[name]
	if next != nil {
		c.replacing[name] = next
	} else {
		delete(c.replacing, name)
	}
	c.mu.Unlock()
	if prev != nil {
		prev.stop()
	}
}

func (c *Cache) removeMember(name string) {
	c.dropReplacement(name, nil)
	c.mu.Lock()
	m := c.members[name]
	delete(c.members, name)
	c.resort()
	c.mu.Unlock()
	c.freezeLog.Clear(name)
	c.ids.unknownLog.Clear(name)
	if m != nil {
		m.stop()
		c.handler(Event{Member: name, Kind: KindMember})
	}
}

func (c *Cache) resort() {
	c.sorted = c.sorted[:0:0]
	for _, m := range c.members {
		c.sorted = append(c.sorted, m)
	}
	sort.Slice(c.sorted, func(i, j int) bool { return c.sorted[i].name < c.sorted[j].name })
}

// setMetas keeps the members' labels and drains; a member whose labels or
// drain changed is a KindMember event: the exports whose scope selects by
// labels, and those of a member that drains, are computed again.
func (c *Cache) setMetas(next map[string]memberMeta) {
	c.mu.Lock()
	prev := c.metas
	c.metas = next
	c.mu.Unlock()
	var changed []string
	for name, m := range next {
		if !m.equal(prev[name]) {
			changed = append(changed, name)
		}
	}
	for name, m := range prev {
		if _, ok := next[name]; !ok && !m.equal(memberMeta{}) {
			changed = append(changed, name)
		}
	}
	sort.Strings(changed)
	for _, name := range changed {
		logDrainChange(name, prev[name], next[name])
		c.handler(Event{Member: name, Kind: KindMember})
	}
}

// MemberLabels are the labels of the member of that name, as its
// membership source has them; nil when none names it.
func (c *Cache) MemberLabels(name string) map[string]string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.metas[name].labels
}

// Snapshot returns the read-only view the import computation reads. The
// listers in it keep following the members; the member set is fixed.
func (c *Cache) Snapshot() imports.ClusterSet {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cs := imports.ClusterSet{Name: c.opts.ClusterSetName, Local: c.opts.LocalName, Members: make([]imports.Member, 0, len(c.sorted))}
	for _, m := range c.sorted {
		v := m.view()
		meta := c.metas[m.name]
		v.Labels = meta.labels
		v.Draining, _ = meta.draining()
		cs.Members = append(cs.Members, v)
	}
	return cs
}

// Ready reports nil once every membership source has reported and every
// member has listed, is past its removal threshold, or answers but is
// flagged for what keeps it from listing (member.readyErr):
// before that, imports computed from a partial cache would show clusters
// disappearing and reappearing.
func (c *Cache) Ready() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if _, ok := c.members[c.opts.LocalName]; !ok {
		return fmt.Errorf("not connected to the local cluster %s yet", c.opts.LocalName)
	}
	if len(c.unreported) > 0 {
		return fmt.Errorf("membership sources not reported yet: %s", strings.Join(sortedKeys(c.unreported), ", "))
	}
	// A member still joining has listed nothing: like a member that has
	// not listed (member.readyErr), it holds readiness until its removal
	// threshold, counted from when it joined, or until it is flagged for
	// what keeps it from listing (member.flaggedUnlistable).
	var joining []string
	for name, m := range c.joining {
		if m.flaggedUnlistable() {
			continue
		}
		if removeAfter := c.thresholds(name).removeAfter; removeAfter == 0 || time.Since(m.joined) < removeAfter {
			joining = append(joining, name)
		}
	}
	if len(joining) > 0 {
		sort.Strings(joining)
		return fmt.Errorf("members joining (being asked which APIs they serve): %s", strings.Join(joining, ", "))
	}
	for _, m := range c.sorted {
		if err := m.readyErr(); err != nil {
			return err
		}
	}
	return nil
}

// LocalReady reports nil once the local cluster has listed: what the
// summaries this server publishes are computed from.
func (c *Cache) LocalReady() error {
	m := c.member(c.opts.LocalName)
	if m == nil {
		return fmt.Errorf("not connected to the local cluster %s yet", c.opts.LocalName)
	}
	if !m.hasSynced() {
		return fmt.Errorf("the local cluster %s has not listed yet", c.opts.LocalName)
	}
	return nil
}

// PoolsUsingService returns the namespace/name keys of the member's pools
// whose endpointPickerRef names the Service namespace/service.
func (c *Cache) PoolsUsingService(memberName, namespace, service string) []string {
	if m := c.member(memberName); m != nil {
		return m.poolsUsingService(namespace, service)
	}
	return nil
}

// PoolsWithParent returns the namespace/name keys of the member's pools
// whose status lists the Gateway namespace/gateway as a parent.
func (c *Cache) PoolsWithParent(memberName, namespace, gateway string) []string {
	if m := c.member(memberName); m != nil {
		return m.poolsIndexedBy(indexParentGateway, namespace+"/"+gateway)
	}
	return nil
}

// ImportsRoutedThrough returns the namespace/name keys of the imports that
// the local cluster's HTTPRoutes with parent Gateway namespace/gateway use:
// a change of that Gateway may change their parents.
func (c *Cache) ImportsRoutedThrough(namespace, gateway string) []string {
	if m := c.member(c.opts.LocalName); m != nil {
		return m.importsRoutedThrough(namespace, gateway)
	}
	return nil
}

// ImportsRoutedFrom returns the namespace/name keys of the imports that the
// local cluster's HTTPRoutes of namespace use: a change of that namespace's
// labels may change whether a Gateway takes them.
func (c *Cache) ImportsRoutedFrom(namespace string) []string {
	if m := c.member(c.opts.LocalName); m != nil {
		return m.importsRoutedFrom(namespace)
	}
	return nil
}

// member is the member serving name, nil when there is none.
func (c *Cache) member(name string) *member {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.members[name]
}

// thresholds are member name's: the local cluster is never removed, as its
// namespaces decide every placement.
func (c *Cache) thresholds(name string) thresholds {
	th := thresholds{unreachableAfter: c.opts.UnreachableAfter, removeAfter: c.opts.RemoveAfter}
	if name == c.opts.LocalName {
		th.removeAfter = 0
	}
	return th
}

func sortedKeys(set map[string]bool) []string {
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
