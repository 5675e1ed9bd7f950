package localclusterset

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ServiceClusterIPRange is where kube-apiserver allocates Service cluster
// IPs. Nothing routes it: it is an allocation range only, never a target.
const ServiceClusterIPRange = "10.96.0.0/16"

const (
	etcdReadyTimeout      = time.Minute
	apiServerReadyTimeout = 3 * time.Minute
	stopGrace             = 15 * time.Second
)

func etcdProcess(dir, binDir string, clientPort, peerPort int) *process {
	client := "http://" + hostPort(clientPort)
	peer := "http://" + hostPort(peerPort)
	return &process{
		Name:   "etcd",
		Binary: filepath.Join(binDir, "etcd"),
		Port:   clientPort,
		Log:    filepath.Join(dir, "logs", "etcd.log"),
		Args: []string{
			"--name=mci-local",
			"--data-dir=" + filepath.Join(dir, "etcd"),
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=mci-local=" + peer,
			// Throw-away data on a disk shared by several people: an fsync per
			// write would make every apiserver request wait on the disk.
			"--unsafe-no-fsync",
			"--log-level=warn",
		},
	}
}

// apiServerProcess is one member cluster's kube-apiserver. Clusters share
// the etcd, each under its own key prefix.
func apiServerProcess(dir, binDir, cluster string, etcdPort, port int) *process {
	pki := func(name string) string { return filepath.Join(dir, "pki", name) }
	cert := apiServerCertName(cluster)
	return &process{
		Name:   cluster + "-kube-apiserver",
		Binary: filepath.Join(binDir, "kube-apiserver"),
		Port:   port,
		Log:    filepath.Join(dir, "logs", cluster+"-kube-apiserver.log"),
		Args: []string{
			"--etcd-servers=http://" + hostPort(etcdPort),
			"--etcd-prefix=/" + cluster,
			"--bind-address=127.0.0.1",
			// Left unset, the advertised address would be the host's
			// default interface, since the bind address is loopback.
			"--advertise-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", port),
			"--tls-cert-file=" + pki(cert+".crt"),
			"--tls-private-key-file=" + pki(cert+".key"),
			"--client-ca-file=" + pki("client-ca.crt"),
			"--authorization-mode=RBAC",
			// The aggregator: who may assert identities in headers, and the
			// certificate it proves itself with to mci-apiserver.
			"--requestheader-client-ca-file=" + pki("front-proxy-ca.crt"),
			"--requestheader-allowed-names=" + frontProxyClientName,
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + pki("front-proxy-client.crt"),
			"--proxy-client-key-file=" + pki("front-proxy-client.key"),
			"--service-account-issuer=https://kubernetes.default.svc." + cluster,
			"--service-account-key-file=" + pki("sa.pub"),
			"--service-account-signing-key-file=" + pki("sa.key"),
			"--service-cluster-ip-range=" + ServiceClusterIPRange,
			// The reconciler publishes the advertised address as the endpoint
			// of the "kubernetes" Service, and Endpoints validation rejects
			// loopback addresses (an error every 10s): keep it off.
			"--endpoint-reconciler-type=none",
			// This plugin refuses a Pod until the "default" ServiceAccount of
			// its namespace exists, which the controller-manager creates a
			// moment after the namespace; tests create Pods (which no
			// kubelet runs) right after their namespace.
			"--disable-admission-plugins=ServiceAccount",
			// Many apiservers on two shared cores: skip the profiling
			// endpoints and keep the log readable.
			"--profiling=false",
			"-v=1",
		},
	}
}

// waitReady polls check until it says ready, failing early with the
// server's log when p, the server awaited, exits. p is nil for a server
// this package does not run.
func waitReady(ctx context.Context, p *process, timeout time.Duration, check func(context.Context) (bool, string)) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if p != nil {
			select {
			case <-p.exited():
				return false, p.exitError()
			default:
			}
		}
		ok, msg := check(ctx)
		last = msg
		return ok, nil
	})
	if err != nil {
		if !wait.Interrupted(err) {
			return err
		}
		if p == nil {
			return fmt.Errorf("not ready after %s (last: %s): %w", timeout, last, err)
		}
		return fmt.Errorf("%s did not become ready (last: %s): %w; last lines of %s:\n%s", p.Name, last, err, p.Log, p.logTail(15))
	}
	return nil
}

// etcdHealthy asks etcd's /health endpoint.
func etcdHealthy(port int) func(context.Context) (bool, string) {
	url := "http://" + hostPort(port) + "/health"
	return func(ctx context.Context) (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`), string(body)
	}
}

// apiServerReady asks kube-apiserver's /readyz, which includes its
// post-start hooks (RBAC bootstrap roles, CRD and APIService controllers).
func apiServerReady(cfg *rest.Config) func(context.Context) (bool, string) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 5 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	return func(ctx context.Context) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			// A failing /readyz answers 500 with the failing checks in body.
			if len(body) > 0 {
				return false, failedChecks(string(body))
			}
			return false, err.Error()
		}
		return strings.TrimSpace(string(body)) == "ok", string(body)
	}
}

// failedChecks keeps the first "[-]" lines of a /readyz answer.
func failedChecks(body string) string {
	var failed []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "[-]") {
			failed = append(failed, l)
		}
	}
	switch {
	case len(failed) == 0:
		return body
	case len(failed) > 3:
		return fmt.Sprintf("%s and %d more", strings.Join(failed[:3], "; "), len(failed)-3)
	}
	return strings.Join(failed, "; ")
}
