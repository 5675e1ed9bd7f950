package clusterset

// Kind is the kind of object an Event is about.
type Kind int

const (
	// KindMember says a member joined, left, was read anew, or changed in
	// what the view of the members records of it (reachability,
	// credentials, freeze, labels, drain): everything computed from it
	// may have changed.
	KindMember Kind = iota
	KindInferencePool
	KindService
	KindEndpointSlice
	KindGateway
	KindNamespace
	// KindHTTPRoute and KindReferenceGrant are watched in the local cluster
	// only: they decide the parents of the imports it serves.
	KindHTTPRoute
	KindReferenceGrant
	KindBackendTLSPolicy
	// KindExportSummary is an InferencePoolExportSummary of a member read
	// in summary mode: it stands for that member's pool and everything the
	// pool's entry of an import is computed from.
	KindExportSummary
	// KindPod is a pod of a namespace of the member's pools: an export
	// publishes the addresses of its pool's pods.
	KindPod
	// KindListed says the member's caches hold everything up to
	// ResourceVersion, a version their lists or their watches' bookmarks
	// reached: nothing changed, but a deletion before it, which no listed
	// object carries, or a change no cached object reflects, is known to
	// be covered. It names no object.
	KindListed
)

func (k Kind) String() string {
	switch k {
	case KindMember:
		return "Member"
	case KindInferencePool:
		return "InferencePool"
	case KindService:
		return "Service"
	case KindEndpointSlice:
		return "EndpointSlice"
	case KindGateway:
		return "Gateway"
	case KindNamespace:
		return "Namespace"
	case KindHTTPRoute:
		return "HTTPRoute"
	case KindReferenceGrant:
		return "ReferenceGrant"
	case KindBackendTLSPolicy:
		return "BackendTLSPolicy"
	case KindExportSummary:
		return "InferencePoolExportSummary"
	case KindPod:
		return "Pod"
	case KindListed:
		return "Listed"
	}
	return "Unknown"
}

// Event says that an object in a member's cache changed. It carries only
// the object's coordinates: consumers read the current state from a
// Snapshot, so events can be coalesced freely.
type Event struct {
	Member    string
	Kind      Kind
	Namespace string
	Name      string
	// ResourceVersion is the member's resourceVersion at this change, 0 when
	// unknown (member events, deletions observed only through a relist).
	ResourceVersion uint64
	// Service is, for an EndpointSlice, the name of the Service it
	// belongs to; for other kinds it is empty.
	Service string
	// Imports are, for an HTTPRoute, the namespace/name keys of the
	// InferencePoolImports it uses as backendRefs before and after the
	// change; for other kinds it is empty.
	Imports []string
	// Replaced is set on the KindMember event of a member whose caches
	// were replaced by a new read of it (it joined, or a read with other
	// credentials or in another mode took the old one's place): the new
	// caches' data came in out of the member's order, deletions made
	// meanwhile included, which no resourceVersion places. Every other
	// member event leaves the member's data as it was.
	Replaced bool
}

// Handler receives events. It must not block: the cache calls it from
// informer goroutines.
type Handler func(Event)
