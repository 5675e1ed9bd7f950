package localclusterset

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
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
// cmd/mci-apiserver: the flags below are all it is given. Replica 0 is
// named after its cluster alone, replica r > 0 gets a "-<r>" suffix.
func mciAPIServerProcess(dir, binary, cluster, membersDir string, replica, port int, flags mciServerFlags) *process {
	kubeconfig := filepath.Join(dir, cluster+".kubeconfig")
	name := cluster + "-mci-apiserver"
	if replica > 0 {
		name = fmt.Sprintf("%s-%d", name, replica)
	}
	p := &process{
		Name:   name,
		Binary: binary,
		Port:   port,
		Log:    filepath.Join(dir, "logs", name+".log"),
		Args: []string{
			"--cluster-name=" + cluster,
			"--clusterset-name=" + ClusterSetName,
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--member-kubeconfig-dir=" + membersDir,
			"--namespace=" + MCIAPIServerNamespace,
			fmt.Sprintf("--secure-port=%d", port),
			"--bind-address=127.0.0.1",
			"--tls-cert-file=" + filepath.Join(dir, "pki", "mci-apiserver.crt"),
			"--tls-private-key-file=" + filepath.Join(dir, "pki", "mci-apiserver.key"),
			// As in artifacts/deploy: /readyz fails at once on SIGTERM so the
			// front (the Service) stops sending new connections before the
			// listener closes and the server sends GOAWAY on the
			// connections it has.
			"--shutdown-delay-duration=1s",
			"-v=2",
		},
	}
	if flags.unreachableAfter > 0 {
		p.Args = append(p.Args, "--member-unreachable-after="+flags.unreachableAfter.String())
	}
	if flags.removeAfter > 0 {
		p.Args = append(p.Args, "--member-remove-after="+flags.removeAfter.String())
	}
	if flags.watchHistorySize > 0 {
		p.Args = append(p.Args, fmt.Sprintf("--watch-history-size=%d", flags.watchHistorySize))
	}
	if mode := flags.summariesFor(cluster); mode != "" {
		p.Args = append(p.Args, "--member-summaries="+mode)
	}
	return p
}

// mciServerFlags are the flags Options set on every mci-apiserver; the
// server's defaults when zero.
type mciServerFlags struct {
	unreachableAfter, removeAfter time.Duration
	memberSummaries               string
	summariesOf                   map[string]string
	watchHistorySize              int
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
//
// While it is not, the APIService is asked to be checked again
// (recheckAPIService), at most once every recheckEvery: the aggregator's
// availability controller retries a server it found down with a backoff
// that doubles up to 30 s, so a server that was down for a while was
// found serving again 9 to 22 s after it started (measured with repeated
// restarts of one mci-apiserver), and every restart of a test waited for
// that rather than for the server.
func waitAPIServiceAvailable(ctx context.Context, log io.Writer, cluster string, p *process, kube kubernetes.Interface, client dynamic.Interface) error {
	check := apiServiceAvailable(kube, client)
	var printed string
	var rechecked time.Time
	return waitReady(ctx, p, apiServiceAvailableTimeout, func(ctx context.Context) (bool, string) {
		ok, msg := check(ctx)
		if !ok && msg != printed {
			fmt.Fprintf(log, "    %s: APIService %s not Available yet: %s\n", cluster, APIServiceName, msg)
			printed = msg
		}
		if !ok && time.Since(rechecked) >= recheckEvery {
			rechecked = time.Now()
			if err := recheckAPIService(ctx, client); err != nil {
				return false, msg + "; asking for a recheck: " + err.Error()
			}
		}
		return ok, msg
	})
}

// recheckEvery is how often waitAPIServiceAvailable asks for a recheck.
const recheckEvery = time.Second

// recheckAPIService makes the aggregator check the APIService again now:
// its availability controller queues an APIService at once on any update
// of it, such as this annotation's, as it would after `kubectl annotate`.
func recheckAPIService(ctx context.Context, client dynamic.Interface) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, recheckAnnotation, time.Now().UTC().Format(time.RFC3339Nano))
	_, err := client.Resource(apiServiceGVR).Patch(ctx, APIServiceName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// recheckAnnotation is the annotation recheckAPIService writes.
const recheckAnnotation = "localclusterset.mci.dev/recheck-requested"

func (cs *ClusterSet) startMCIAPIServer(ctx context.Context, c *Cluster) error {
	for _, p := range c.mciProcesses() {
		cs.progress("starting %s on %s", p.Name, hostPort(p.Port))
		if err := p.start(cs.detached); err != nil {
			return err
		}
	}
	if c.MCIAPIServerPort != c.mciAPIServer.Port {
		f, err := startReplicaFront(c.MCIAPIServerPort, c.MCIAPIServerReplicaPorts, cs.pki.mciServingCA.certPEM)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		c.front = f
		cs.progress("front for %s's mci-apiservers (%d) on %s", c.Name, len(c.MCIAPIServerReplicaPorts), hostPort(c.MCIAPIServerPort))
	}
	kube, dyn, err := clients(c.Config)
	if err != nil {
		return err
	}
	if err := registerMCIAPIServer(ctx, kube, dyn, c.MCIAPIServerPort, cs.pki.mciServingCA.certPEM); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return nil
}

// waitMCIAPIServer waits until every replica is ready and the aggregator
// serves the API.
func (cs *ClusterSet) waitMCIAPIServer(ctx context.Context, c *Cluster) error {
	// Every replica, a single one too: the aggregator may call the
	// APIService Available before the server's /readyz first passes.
	for _, p := range c.mciProcesses() {
		cs.progress("waiting for %s to be ready", p.Name)
		if err := waitReady(ctx, p, apiServiceAvailableTimeout, replicaReady(p.Port, cs.pki.mciServingCA.certPEM)); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
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

// mciProcesses are the mci-apiserver replicas of c, replica 0 first.
func (c *Cluster) mciProcesses() []*process {
	if c.mciAPIServer == nil {
		return nil
	}
	return append([]*process{c.mciAPIServer}, c.mciReplicas...)
}

// mciReplica points at the process of replica r of c, so that a restart
// can replace it.
func (c *Cluster) mciReplica(r int) (**process, error) {
	switch {
	case c.mciAPIServer == nil:
		return nil, fmt.Errorf("clusterset: %s runs no mci-apiserver (Options.MCIAPIServerBinary was empty)", c.Name)
	case r == 0:
		return &c.mciAPIServer, nil
	case r > 0 && r <= len(c.mciReplicas):
		return &c.mciReplicas[r-1], nil
	}
	return nil, fmt.Errorf("clusterset: %s has no mci-apiserver replica %d (it runs %d)", c.Name, r, 1+len(c.mciReplicas))
}

// replicaReady asks one mci-apiserver replica's /readyz, which is open to
// anonymous requests, as a kubelet's readiness probe would.
func replicaReady(port int, caPEM []byte) func(context.Context) (bool, string) {
	client := replicaClient(caPEM)
	url := "https://" + hostPort(port) + "/readyz"
	return func(ctx context.Context) (bool, string) {
		code, body, err := getEndpoint(ctx, client, url)
		if err != nil {
			return false, err.Error()
		}
		if code != http.StatusOK {
			return false, fmt.Sprintf("%d %s: %s", code, http.StatusText(code), failedChecks(body))
		}
		return true, ""
	}
}

// getEndpoint GETs a health endpoint (/readyz, /healthz) and returns its
// status code and the first 4 KiB of its body.
func getEndpoint(ctx context.Context, client *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body), nil
}

func replicaClient(caPEM []byte) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true},
	}
}

// replicaFront stands for the Service in front of an mci-apiserver
// Deployment, however many replicas it has: a TCP listener on loopback
// that hands each connection to the next replica whose /readyz answered
// last time it was asked, trying the next ready one when a replica
// refuses the connection, and closes a connection when none is ready, as
// kube-proxy rejects one to a Service without ready endpoints. A replica
// that restarts is sent nothing until its /readyz answers: one that is
// not ready yet (its authentication not yet loaded: it would take the
// aggregator's requests as anonymous) gets no request a kubelet's
// readiness probe would keep from it.
//
// Until a replica of the cluster has first been ready, though, the front
// hands connections to the replicas that are not: the harness starts
// every cluster's server at once, and each is ready only once it has read
// the others' summaries, which their fronts would not serve. A ClusterSet
// installed one cluster at a time never waits so (a server reads the
// members that run no mci-apiserver yet in full mode); one whose servers
// all restart at once does, until the storage initialization timeout
// (docs/membership.md). TLS passes through untouched: the aggregator
// still verifies the replica's certificate.
type replicaFront struct {
	listener net.Listener
	backends []int
	ready    []atomic.Bool
	// served: a replica has been ready.
	served atomic.Bool
	next   atomic.Uint64
	stop   chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

const frontProbeInterval = 250 * time.Millisecond

func startReplicaFront(port int, backends []int, caPEM []byte) (*replicaFront, error) {
	l, err := net.Listen("tcp", hostPort(port))
	if err != nil {
		return nil, fmt.Errorf("starting the front of the mci-apiserver replicas: %w", err)
	}
	f := &replicaFront{
		listener: l,
		backends: backends,
		ready:    make([]atomic.Bool, len(backends)),
		stop:     make(chan struct{}),
		conns:    map[net.Conn]struct{}{},
	}
	f.wg.Go(f.accept)
	for i, b := range backends {
		check := replicaReady(b, caPEM)
		f.wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { <-f.stop; cancel() }()
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				ok, _ := check(ctx)
				f.ready[i].Store(ok)
				if ok {
					f.served.Store(true)
				}
			}, frontProbeInterval)
		})
	}
	return f, nil
}

func (f *replicaFront) accept() {
	for {
		conn, err := f.listener.Accept()
		if err != nil {
			return // closed
		}
		f.wg.Go(func() { f.relay(conn) })
	}
}

// candidates are the ready backends to try for one connection, starting
// from the next in turn; every one before a replica was first ready.
func (f *replicaFront) candidates() []int {
	start := int(f.next.Add(1))
	starting := !f.served.Load()
	var ready []int
	for i := range f.backends {
		j := (start + i) % len(f.backends)
		if starting || f.ready[j].Load() {
			ready = append(ready, f.backends[j])
		}
	}
	return ready
}

func (f *replicaFront) relay(client net.Conn) {
	defer client.Close()
	var backend net.Conn
	for _, port := range f.candidates() {
		c, err := net.DialTimeout("tcp", hostPort(port), time.Second)
		if err == nil {
			backend = c
			break
		}
	}
	if backend == nil {
		return
	}
	defer backend.Close()
	if !f.track(client, backend) {
		return
	}
	defer f.untrack(client, backend)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// A closed side ends the whole connection, as a dead pod does.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(backend, client)
	go pipe(client, backend)
	<-done
	<-done
}

func (f *replicaFront) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.stop:
		return false
	default:
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *replicaFront) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
	}
}

// close stops listening and cuts every relayed connection.
func (f *replicaFront) close() {
	f.mu.Lock()
	select {
	case <-f.stop:
		f.mu.Unlock()
		return
	default:
	}
	close(f.stop)
	_ = f.listener.Close()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
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
