package clusterset

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// The API that mci-apiserver serves and registers with the aggregator.
const (
	MCIGroup       = "inference.networking.x-k8s.io"
	MCIVersion     = "v1alpha1"
	APIServiceName = MCIVersion + "." + MCIGroup
)

// ClusterSetName is the --clusterset-name every local mci-apiserver gets.
const ClusterSetName = "local"

const apiServiceAvailableTimeout = 90 * time.Second

var apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// mciAPIServerProcess is the contract between this harness and
// cmd/mci-apiserver: the flags below are all it is given.
func mciAPIServerProcess(dir, binary, cluster string, port int) *process {
	kubeconfig := filepath.Join(dir, cluster+".kubeconfig")
	return &process{
		Name:   cluster + "-mci-apiserver",
		Binary: binary,
		Port:   port,
		Log:    filepath.Join(dir, "logs", cluster+"-mci-apiserver.log"),
		Args: []string{
			"--cluster-name=" + cluster,
			"--clusterset-name=" + ClusterSetName,
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--member-kubeconfig-dir=" + filepath.Join(dir, "members"),
			"--namespace=" + MCIAPIServerNamespace,
			fmt.Sprintf("--secure-port=%d", port),
			"--bind-address=127.0.0.1",
			"--tls-cert-file=" + filepath.Join(dir, "pki", "mci-apiserver.crt"),
			"--tls-private-key-file=" + filepath.Join(dir, "pki", "mci-apiserver.key"),
			"-v=2",
		},
	}
}

// registerMCIAPIServer makes the aggregator of one cluster send
// inference.networking.x-k8s.io/v1alpha1 to the mci-apiserver on port.
//
// The aggregator reaches an APIService through a Service. With
// --enable-aggregator-routing off it dials the Service itself rather than
// its endpoints (which could not hold a loopback address anyway), and an
// ExternalName Service resolves to https://<externalName>:<service.port>:
// so "localhost" and the server's port reach a process on this machine,
// while TLS is still verified against mci-apiserver.mci-system.svc.
func registerMCIAPIServer(ctx context.Context, kube kubernetes.Interface, client dynamic.Interface, port int, caBundle []byte) error {
	if err := ensureNamespace(ctx, kube, MCIAPIServerNamespace); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: MCIAPIServerServiceName, Namespace: MCIAPIServerNamespace},
		Spec: corev1.ServiceSpec{
			Type:         corev1.ServiceTypeExternalName,
			ExternalName: "localhost",
			Ports: []corev1.ServicePort{{
				Name: "https", Protocol: corev1.ProtocolTCP, Port: int32(port), TargetPort: intstr.FromInt32(int32(port)),
			}},
		},
	}
	services := kube.CoreV1().Services(MCIAPIServerNamespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := services.Get(ctx, svc.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = services.Create(ctx, svc, metav1.CreateOptions{})
		case err == nil:
			svc.ResourceVersion = current.ResourceVersion
			_, err = services.Update(ctx, svc, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("writing Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}

	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": APIServiceName},
		"spec": map[string]any{
			"group":                MCIGroup,
			"version":              MCIVersion,
			"groupPriorityMinimum": int64(1000),
			"versionPriority":      int64(15),
			"caBundle":             base64.StdEncoding.EncodeToString(caBundle),
			"service": map[string]any{
				"namespace": MCIAPIServerNamespace,
				"name":      MCIAPIServerServiceName,
				"port":      int64(port),
			},
		},
	}}
	apiServices := client.Resource(apiServiceGVR)
	// The aggregator writes the APIService's status all the time: retry an
	// update that raced with it.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := apiServices.Get(ctx, APIServiceName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = apiServices.Create(ctx, apiService, metav1.CreateOptions{})
		case err == nil:
			apiService.SetResourceVersion(current.GetResourceVersion())
			_, err = apiServices.Update(ctx, apiService, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("registering APIService %s: %w", APIServiceName, err)
	}
	return nil
}

// apiServiceAvailable reports whether the aggregator serves the API: the
// APIService's Available condition, whose message is what the aggregator
// saw when it last tried the server (the first thing to read when a
// registration does not work), and then a discovery request through the
// aggregator, since the condition lags behind a server that was just
// restarted.
func apiServiceAvailable(kube kubernetes.Interface, client dynamic.Interface) func(context.Context) (bool, string) {
	return func(ctx context.Context) (bool, string) {
		obj, err := client.Resource(apiServiceGVR).Get(ctx, APIServiceName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if ok, msg := condition(obj, "Available"); !ok {
			return false, msg
		}
		if _, err := kube.Discovery().RESTClient().Get().AbsPath("/apis", MCIGroup, MCIVersion).DoRaw(ctx); err != nil {
			return false, "discovery through the aggregator: " + err.Error()
		}
		return true, ""
	}
}

// waitAPIServiceAvailable waits for the aggregator to report the
// APIService Available, printing each new message of the condition.
func waitAPIServiceAvailable(ctx context.Context, log io.Writer, cluster string, p *process, kube kubernetes.Interface, client dynamic.Interface) error {
	check := apiServiceAvailable(kube, client)
	var printed string
	return waitReady(ctx, p, apiServiceAvailableTimeout, func(ctx context.Context) (bool, string) {
		ok, msg := check(ctx)
		if !ok && msg != printed {
			fmt.Fprintf(log, "    %s: APIService %s not Available yet: %s\n", cluster, APIServiceName, msg)
			printed = msg
		}
		return ok, msg
	})
}

func (cs *ClusterSet) startMCIAPIServer(ctx context.Context, c *Cluster) error {
	cs.progress("starting mci-apiserver for %s on %s", c.Name, hostPort(c.mciAPIServer.Port))
	if err := c.mciAPIServer.start(cs.detached); err != nil {
		return err
	}
	kube, dyn, err := clients(c.Config)
	if err != nil {
		return err
	}
	if err := registerMCIAPIServer(ctx, kube, dyn, c.mciAPIServer.Port, cs.pki.mciServingCA.certPEM); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return nil
}

func (cs *ClusterSet) waitMCIAPIServer(ctx context.Context, c *Cluster) error {
	cs.progress("waiting for APIService %s in %s", APIServiceName, c.Name)
	kube, dyn, err := clients(c.Config)
	if err != nil {
		return err
	}
	if err := waitAPIServiceAvailable(ctx, cs.log, c.Name, c.mciAPIServer, kube, dyn); err != nil {
		return fmt.Errorf("%s: APIService %s: %w", c.Name, APIServiceName, err)
	}
	return nil
}

// MCIServingCertFiles are the certificate and key that an mci-apiserver
// serves with: valid for mci-apiserver.mci-system.svc, localhost and
// 127.0.0.1, and trusted by the APIService's caBundle. For tests that run
// the server in-process and register it with RegisterMCIAPIServer.
func (cs *ClusterSet) MCIServingCertFiles() (certFile, keyFile string) {
	return filepath.Join(cs.Dir, "pki", "mci-apiserver.crt"), filepath.Join(cs.Dir, "pki", "mci-apiserver.key")
}

// RegisterMCIAPIServer points cluster's APIService at an mci-apiserver that
// the caller runs on 127.0.0.1:port with MCIServingCertFiles, and waits
// until the aggregator reports it Available.
func (cs *ClusterSet) RegisterMCIAPIServer(ctx context.Context, cluster string, port int) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	kube, dyn, err := clients(c.Config)
	if err != nil {
		return err
	}
	if err := registerMCIAPIServer(ctx, kube, dyn, port, cs.pki.mciServingCA.certPEM); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return waitAPIServiceAvailable(ctx, cs.log, c.Name, nil, kube, dyn)
}
