package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// The paths an InstanceHandle serves.
const (
	// MetadataPath serves the instance's metadata as a JSON object.
	MetadataPath = "/metadata"
	// ReadyPath is for the pod's readiness probe: 200 when the instance is
	// ready, 503 otherwise.
	ReadyPath = "/ready"
)

// The pod labels seed 002 names for the (namespace, component) an instance
// registers as, and that a Service selects on. CheckKubernetes asserts them.
const (
	NamespaceLabel = "nvidia.com/dynamo-namespace"
	ComponentLabel = "nvidia.com/dynamo-component"
)

// PodNameEnv is the environment variable that names the pod an instance runs
// in, set from the downward API (fieldRef metadata.name).
const PodNameEnv = "POD_NAME"

// Registry is the server side of seed 002, used inside a model-server
// process. Kubernetes is the registry: an instance is its pod, its
// readiness is the pod's readiness probe (which the InstanceHandle's
// ReadyPath answers), and the EndpointSlices Kubernetes derives from the
// probe are what EndpointSliceDiscovery watches. Nothing is written
// anywhere, so a Registry needs no cluster; CheckKubernetes adds the seed's
// assertions about the pod and its Service when a client is at hand.
//
// The zero Registry is ready to use.
type Registry struct {
	// InstanceID overrides the instance ID, which is otherwise the pod name:
	// $POD_NAME, else the host name (which Kubernetes sets to the pod name).
	InstanceID string
}

// RegisterInstance registers this process as an instance of (namespace,
// component). The instance starts not ready, with empty metadata.
func (r Registry) RegisterInstance(namespace, component string) (*InstanceHandle, error) {
	if namespace == "" || component == "" {
		return nil, fmt.Errorf("registering an instance: namespace (%q) and component (%q) are both required", namespace, component)
	}
	id := r.InstanceID
	if id == "" {
		id = os.Getenv(PodNameEnv)
	}
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("registering an instance: no $%s and no host name: %w", PodNameEnv, err)
		}
		id = host
	}
	h := &InstanceHandle{id: id, namespace: namespace, component: component}
	if err := h.SetMetadata(nil); err != nil {
		return nil, err
	}
	return h, nil
}

// InstanceHandle is one registered instance: its ID, metadata and readiness,
// and the HTTP endpoints that publish them. It is safe for concurrent use.
type InstanceHandle struct {
	id, namespace, component string

	mu       sync.RWMutex
	metadata []byte // JSON, encoded when set so that every GET serves the same bytes
	ready    bool
}

// InstanceID is the instance's unique ID: its pod name.
func (h *InstanceHandle) InstanceID() string { return h.id }

// Namespace is the namespace the instance registered in (seed 002's
// namespace, not necessarily a Kubernetes namespace).
func (h *InstanceHandle) Namespace() string { return h.namespace }

// Component is the component the instance registered as.
func (h *InstanceHandle) Component() string { return h.component }

// SetMetadata replaces the metadata that MetadataPath serves; it is visible
// to the next request. It fails, keeping the previous metadata, when the
// map cannot be encoded as JSON. nil is served as {}.
func (h *InstanceHandle) SetMetadata(metadata map[string]any) error {
	if metadata == nil {
		metadata = map[string]any{}
	}
	b, err := json.Marshal(metadata)
	if err != nil {
		return fmt.Errorf("metadata of instance %s: %w", h.id, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.metadata = b
	return nil
}

// SetReady marks the instance ready or not ready for traffic: what
// ReadyPath answers, hence what the pod's readiness probe and then the
// EndpointSlices say.
func (h *InstanceHandle) SetReady(ready bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ready = ready
}

// Ready reports what SetReady last set.
func (h *InstanceHandle) Ready() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.ready
}

// Handler serves MetadataPath and ReadyPath (GET and HEAD) and answers 404
// to anything else.
func (h *InstanceHandle) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(MetadataPath, h.MetadataHandler())
	mux.Handle(ReadyPath, h.ReadinessHandler())
	return mux
}

// MetadataHandler serves the metadata as a JSON object, whatever the path.
func (h *InstanceHandle) MetadataHandler() http.Handler {
	return getOnly(func(w http.ResponseWriter, _ *http.Request) {
		h.mu.RLock()
		body := h.metadata
		h.mu.RUnlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// ReadinessHandler answers 200 when the instance is ready and 503 when it
// is not, whatever the path.
func (h *InstanceHandle) ReadinessHandler() http.Handler {
	return getOnly(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !h.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "instance %s is not ready\n", h.id)
			return
		}
		_, _ = fmt.Fprintf(w, "ok\n")
	})
}

func getOnly(f http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		f(w, r)
	})
}

// ErrRegistration means the instance's pod or Service does not match what
// it registered as; CheckKubernetes wraps it.
var ErrRegistration = errors.New("registration does not match the cluster")

// CheckKubernetes asserts what seed 002's register_instance asserts: that
// the instance's pod (podNamespace/InstanceID) carries NamespaceLabel and
// ComponentLabel with the values it registered, and that a Service in
// podNamespace selects the pod. It returns the name of that Service (the
// first in name order if several do), which EndpointSliceDiscovery watches.
// The client needs get on the pod and list on Services.
func (h *InstanceHandle) CheckKubernetes(ctx context.Context, client kubernetes.Interface, podNamespace string) (string, error) {
	pod, err := client.CoreV1().Pods(podNamespace).Get(ctx, h.id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("instance %s: %w: no pod %s/%s (the instance ID must be the pod name: set $%s from the downward API)", h.id, ErrRegistration, podNamespace, h.id, PodNameEnv)
	}
	if err != nil {
		return "", fmt.Errorf("instance %s: getting its pod: %w", h.id, err)
	}
	for _, want := range []struct{ key, value string }{{NamespaceLabel, h.namespace}, {ComponentLabel, h.component}} {
		if got, ok := pod.Labels[want.key]; !ok || got != want.value {
			return "", fmt.Errorf("instance %s: %w: pod %s/%s has label %s=%q, want %q", h.id, ErrRegistration, podNamespace, pod.Name, want.key, got, want.value)
		}
	}
	services, err := client.CoreV1().Services(podNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("instance %s: listing Services: %w", h.id, err)
	}
	if name, ok := selectingService(services.Items, pod); ok {
		return name, nil
	}
	return "", fmt.Errorf("instance %s: %w: no Service in namespace %s selects pod %s (labels %s=%s, %s=%s)", h.id, ErrRegistration, podNamespace, pod.Name, NamespaceLabel, h.namespace, ComponentLabel, h.component)
}

// selectingService returns the first Service, in name order, whose selector
// picks pod. A Service without a selector picks nothing: its endpoints are
// managed by hand.
func selectingService(services []corev1.Service, pod *corev1.Pod) (string, bool) {
	var names []string
	for _, s := range services {
		if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return "", false
	}
	return slices.Min(names), true
}
