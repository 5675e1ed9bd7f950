package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The resources the suite reads and writes, in their upstream groups.
var (
	poolsGVR   = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	importsGVR = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha1", Resource: "inferencepoolimports"}
	// The About API's ClusterProperty (KEP-2149) whose value names the
	// cluster in its ClusterSet.
	clusterPropertyGVR = schema.GroupVersionResource{Group: "about.k8s.io", Version: "v1alpha1", Resource: "clusterproperties"}
	apiServicesGVR     = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
)

const clusterIDProperty = "cluster.clusterset.k8s.io"

// Cluster is one cluster under test.
type Cluster struct {
	// Context is its kubeconfig context; Name its name in the ClusterSet,
	// which imports carry.
	Context string
	Name    string
	// KubernetesVersion is what its API server says (/version).
	KubernetesVersion string
	// ServedBy says how the cluster serves InferencePoolImport: the
	// APIService's Service for an aggregated API, else "CustomResourceDefinition"
	// (or "not served").
	ServedBy string

	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

func connect(ctx context.Context, cfg Config) ([]*Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if cfg.Kubeconfig != "" {
		rules.Precedence = filepath.SplitList(cfg.Kubeconfig)
	}
	var clusters []*Cluster
	for i, name := range cfg.Contexts {
		rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: name}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("context %q: %w", name, err)
		}
		rc.QPS, rc.Burst = 50, 100
		rc.UserAgent = "mci-conformance"
		c := &Cluster{Context: name}
		if c.Kube, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("context %q: %w", name, err)
		}
		if c.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("context %q: %w", name, err)
		}
		v, err := c.Kube.Discovery().ServerVersion()
		if err != nil {
			return nil, fmt.Errorf("context %q: reaching its API server: %w", name, err)
		}
		c.KubernetesVersion = v.GitVersion
		switch {
		case len(cfg.ClusterNames) > 0:
			c.Name = cfg.ClusterNames[i]
		default:
			c.Name = clusterID(ctx, c.Dynamic)
			if c.Name == "" {
				c.Name = name
			}
		}
		c.ServedBy = servedBy(ctx, c.Dynamic)
		clusters = append(clusters, c)
	}
	seen := map[string]string{}
	for _, c := range clusters {
		if other, ok := seen[c.Name]; ok {
			return nil, fmt.Errorf("contexts %q and %q are both cluster %q: name the clusters with --cluster-names", other, c.Context, c.Name)
		}
		seen[c.Name] = c.Context
	}
	return clusters, nil
}

// clusterID reads the About API's cluster name, "" when the cluster has none.
func clusterID(ctx context.Context, dyn dynamic.Interface) string {
	obj, err := dyn.Resource(clusterPropertyGVR).Get(ctx, clusterIDProperty, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	v, _, _ := unstructured.NestedString(obj.Object, "spec", "value")
	return v
}

// servedBy says what serves the imports: an aggregated API's Service, or a
// CustomResourceDefinition (the kube-apiserver itself).
func servedBy(ctx context.Context, dyn dynamic.Interface) string {
	name := importsGVR.Version + "." + importsGVR.Group
	obj, err := dyn.Resource(apiServicesGVR).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "not served"
	case err != nil:
		return "unknown (" + err.Error() + ")"
	}
	ns, _, _ := unstructured.NestedString(obj.Object, "spec", "service", "namespace")
	svc, _, _ := unstructured.NestedString(obj.Object, "spec", "service", "name")
	if svc == "" {
		return "CustomResourceDefinition"
	}
	return "aggregated API server (Service " + strings.Trim(ns+"/"+svc, "/") + ")"
}
