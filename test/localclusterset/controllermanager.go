package localclusterset

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// controllerManagerUser is the identity kube-controller-manager logs in
// with: kube-apiserver's bootstrap RBAC binds the system:kube-controller-manager
// ClusterRole (and the kube-system role that reads the authentication
// ConfigMap) to this user, as in a kubeadm cluster.
const controllerManagerUser = "system:kube-controller-manager"

// controllerManagerControllers are the controllers that do something
// useful in a cluster without nodes:
//   - namespace: `kubectl delete namespace` empties the namespace and
//     finishes;
//   - garbage-collector: owner references are honoured (dependents of a
//     deleted owner go, foreground and orphan deletion work);
//   - serviceaccount and serviceaccount-token: every namespace gets its
//     "default" ServiceAccount, and token Secrets are filled, signed with
//     the key kube-apiserver verifies;
//   - root-ca-certificate-publisher: every namespace gets the
//     kube-root-ca.crt ConfigMap;
//   - clusterrole-aggregation: the admin/edit/view ClusterRoles pick up
//     rules labelled to aggregate into them.
//
// Left off on purpose: the endpoints, endpointslice and
// endpointslice-mirroring controllers would rewrite EndpointSlices from the
// Pods a Service selects, but the harness writes EndpointSlices itself
// (with documentation-range addresses, since slices may not hold the
// loopback addresses its "pods" really have; see ARCHITECTURE.md, "What
// the API server accepts on loopback"), and a controller writing the same
// slices would fight it. Everything that needs a node (node lifecycle,
// IPAM, volumes, daemonsets) or creates Pods that no kubelet would run
// (deployment, replicaset, job) is off too.
var controllerManagerControllers = []string{
	"namespace-controller",
	"garbage-collector-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"clusterrole-aggregation-controller",
}

const controllerManagerReadyTimeout = 2 * time.Minute

// controllerManagerKubeconfig is where cluster's kube-controller-manager
// finds its identity; it is regenerated with the PKI on every fresh Up.
func controllerManagerKubeconfig(dir, cluster string) string {
	return filepath.Join(dir, "pki", "kube-controller-manager-"+cluster+".kubeconfig")
}

// controllerManagerProcess is one member cluster's kube-controller-manager.
// It serves /healthz on port with the cluster's kube-apiserver serving
// certificate (valid for 127.0.0.1, signed by the serving CA), so that the
// harness checks it with verified TLS.
func controllerManagerProcess(dir, binDir, cluster string, port int) *process {
	pki := func(name string) string { return filepath.Join(dir, "pki", name) }
	kubeconfig := controllerManagerKubeconfig(dir, cluster)
	cert := apiServerCertName(cluster)
	return &process{
		Name:   cluster + "-kube-controller-manager",
		Binary: filepath.Join(binDir, "kube-controller-manager"),
		Port:   port,
		Log:    filepath.Join(dir, "logs", cluster+"-kube-controller-manager.log"),
		Args: []string{
			"--kubeconfig=" + kubeconfig,
			// Delegated authentication and authorization of its own
			// endpoints (/metrics), as in a real control plane;
			// /healthz is always allowed.
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			// Each controller acts as its own ServiceAccount in kube-system
			// with the system:controller:* role kube-apiserver bootstraps
			// for it (the namespace controller may delete anything in a
			// namespace, the controller-manager's own identity may not).
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + pki("sa.key"),
			"--root-ca-file=" + pki("serving-ca.crt"),
			"--controllers=" + strings.Join(controllerManagerControllers, ","),
			// One controller-manager per cluster: nothing to elect, and no
			// Lease written every few seconds.
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", port),
			"--tls-cert-file=" + pki(cert+".crt"),
			"--tls-private-key-file=" + pki(cert+".key"),
			"--profiling=false",
			"-v=1",
		},
	}
}

// writeControllerManagerKubeconfig writes the kubeconfig of cluster's
// kube-controller-manager, with a client certificate for
// controllerManagerUser.
func (cs *ClusterSet) writeControllerManagerKubeconfig(c *Cluster) error {
	kp, err := cs.pki.clientCA.sign(certRequest{commonName: controllerManagerUser, usage: x509.ExtKeyUsageClientAuth})
	if err != nil {
		return err
	}
	return writeKubeconfig(controllerManagerKubeconfig(cs.Dir, c.Name), kubeconfig(c.Name, c.Server, cs.pki.servingCA.certPEM, controllerManagerUser, kp))
}

// controllerManagerHealthy asks kube-controller-manager's /healthz, which
// reports ok once its controllers have started.
func controllerManagerHealthy(port int, caPEM []byte) func(context.Context) (bool, string) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	url := "https://" + hostPort(port) + "/healthz"
	return func(ctx context.Context) (bool, string) {
		code, body, err := getEndpoint(ctx, client, url)
		if err != nil {
			return false, err.Error()
		}
		return code == http.StatusOK && strings.TrimSpace(body) == "ok", fmt.Sprintf("%d: %s", code, body)
	}
}

// startControllerManager starts cluster's kube-controller-manager; Up
// waits for it with waitControllerManager once the CRDs are installed.
func (cs *ClusterSet) startControllerManager(c *Cluster, port int) error {
	if err := cs.writeControllerManagerKubeconfig(c); err != nil {
		return err
	}
	c.controllerManager = controllerManagerProcess(cs.Dir, cs.binDir, c.Name, port)
	cs.progress("starting %s kube-controller-manager on %s (controllers: namespace, garbage collector, service accounts)", c.Name, hostPort(port))
	if err := c.controllerManager.start(cs.detached); err != nil {
		return err
	}
	return cs.saveState()
}

func (cs *ClusterSet) waitControllerManager(ctx context.Context, c *Cluster) error {
	cs.progress("waiting for %s kube-controller-manager to be healthy", c.Name)
	return waitReady(ctx, c.controllerManager, controllerManagerReadyTimeout, controllerManagerHealthy(c.controllerManager.Port, cs.pki.servingCA.certPEM))
}
