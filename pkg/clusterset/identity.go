package clusterset

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/statelog"
)

// clusterIDNamespace is the Namespace whose uid identifies a cluster: the
// identifier KEP-2149's ClusterProperty cluster.clusterset.k8s.io
// conventionally holds. Every cluster has it, it is never recreated, and
// reading it needs one narrow permission (get on that one Namespace),
// whatever the mode the member is read in: a full-mode member names no
// cluster in what it sends, and a summary names the cluster as its own
// mci-apiserver was told to.
const clusterIDNamespace = "kube-system"

// Why a member's cluster ID is unknown, as mci_clusterset_member_cluster_id_unknown
// names it.
const (
	idForbidden = "forbidden"
	idError     = "error"
)

var idReasons = []string{idForbidden, idError}

// clusterClaim is one member instance's claim to a cluster: the cluster ID
// it read, and what decides which of two members with the same ID keeps it.
type clusterClaim struct {
	member string
	id     string
	// local: the cluster this server serves always keeps its ID.
	local bool
	// joined is when the member's Secret or ClusterProfile was created, as
	// every replica reads it; zero for a kubeconfig file of the member
	// directory (the operator's own, there from the start).
	joined time.Time
}

// first reports whether a keeps a cluster ID that b has too: the local
// cluster, else the member that joined first, else the one whose name
// sorts first. It depends on nothing a replica decides alone (not when it
// started, nor in which order it connected), so every replica refuses the
// same member.
func (a clusterClaim) first(b clusterClaim) bool {
	switch {
	case a.local != b.local:
		return a.local
	case !a.joined.Equal(b.joined):
		return a.joined.Before(b.joined)
	}
	return a.member < b.member
}

// refusals applies the identity rule to claims: of the members that read
// one cluster ID, one keeps it (clusterClaim.first); each claim of another
// member name is refused, and mapped to the name of the member that keeps
// it. Claims of one name (a member and its replacement still listing) do
// not refuse each other.
func refusals(claims []clusterClaim) map[clusterClaim]string {
	keeper := map[string]clusterClaim{}
	for _, c := range claims {
		if c.id == "" {
			continue
		}
		if k, ok := keeper[c.id]; !ok || c.first(k) {
			keeper[c.id] = c
		}
	}
	out := map[clusterClaim]string{}
	for _, c := range claims {
		if k, ok := keeper[c.id]; ok && c.id != "" && k.member != c.member {
			out[c] = k.member
		}
	}
	return out
}

// clusterID is what a member instance read of its cluster ID.
type clusterID struct {
	mu sync.Mutex
	id string
	// unknown is why it could not be read (idForbidden, idError), "" once
	// read or before it was tried.
	unknown string
}

func (c *clusterID) get() (id, unknown string) {
	if c == nil {
		return "", ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id, c.unknown
}

// identities keeps every member instance's claim and applies the rule
// each time one changes.
type identities struct {
	mu     sync.Mutex
	claims map[*member]clusterClaim
	// unknownLog says once per change, per member name, that its ID cannot
	// be read.
	unknownLog statelog.Log[string]
}

// readClusterID reads the uid of the member's kube-system Namespace,
// within discoveryTimeout.
func (m *member) readClusterID(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	core, err := m.coreClient()
	if err != nil {
		return "", err
	}
	ns, err := core.Namespaces().Get(ctx, clusterIDNamespace, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if ns.UID == "" {
		return "", fmt.Errorf("the member's %s Namespace has no uid", clusterIDNamespace)
	}
	return string(ns.UID), nil
}

// identify reads member m's cluster ID and applies the identity rule: a
// member whose cluster is already a member under another name is refused,
// as one whose cluster summary names another cluster is (frozen, quota
// identity, nothing of it served). A member whose ID cannot be read is
// said so once per change and served as before: the check needs get on
// its kube-system Namespace, which member identities minted before it
// lack, and refusing them would take members out of service for a
// missing permission rather than for what they are.
func (c *Cache) identify(ctx context.Context, m *member) {
	if m.identity == nil {
		m.identity = &clusterID{}
	}
	logger := klog.FromContext(ctx).WithValues("member", m.name)
	id, err := m.readClusterID(ctx)
	unknown := ""
	switch {
	case err == nil:
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		unknown = idForbidden
	default:
		unknown = idError
	}
	m.identity.mu.Lock()
	if err == nil {
		m.identity.id = id
	}
	m.identity.unknown = unknown
	m.identity.mu.Unlock()

	if unknown != "" {
		if c.ids.unknownLog.Observe(m.name, unknown, unknown).Loud() {
			logger.Error(err, "Cannot read the member's cluster ID (the uid of its kube-system Namespace): whether it is another member under a second name is not checked, and it is served as it is; its credentials need get on that Namespace",
				"reason", unknown)
		}
		return
	}
	if was, _ := c.ids.unknownLog.Clear(m.name); was {
		logger.Info("The member's cluster ID is read now; it is checked against the other members'", "clusterID", id)
	}

	c.ids.mu.Lock()
	if c.ids.claims == nil {
		c.ids.claims = map[*member]clusterClaim{}
	}
	c.ids.claims[m] = clusterClaim{member: m.name, id: id, local: m.local, joined: m.created}
	claims := make([]clusterClaim, 0, len(c.ids.claims))
	owners := map[clusterClaim][]*member{}
	for mb, claim := range c.ids.claims {
		if mb.isStopped() {
			// Replaced, removed, or a fresh read dropped.
			delete(c.ids.claims, mb)
			continue
		}
		claims = append(claims, claim)
		owners[claim] = append(owners[claim], mb)
	}
	c.ids.mu.Unlock()

	refused := refusals(claims)
	names := make([]clusterClaim, 0, len(refused))
	for claim := range refused {
		names = append(names, claim)
	}
	sort.Slice(names, func(i, j int) bool { return names[i].member < names[j].member })
	for _, claim := range names {
		for _, mb := range owners[claim] {
			mb.freeze(quotaIdentity, fmt.Sprintf("it is the cluster of the member named %q under a second name: both read %s as the uid of their %s Namespace, and %q keeps it (the local cluster, else the member that joined first, else the name that sorts first)",
				refused[claim], claim.id, clusterIDNamespace, refused[claim]))
		}
	}
}

// identityUnknown is why the member's cluster ID is unknown, for the
// metrics: "" once read.
func (m *member) identityUnknown() string {
	_, unknown := m.identity.get()
	return unknown
}
