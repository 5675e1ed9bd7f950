package e2e

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// defaultUnreachableAfter is mci-apiserver's --member-unreachable-after
// default, which the shared ClusterSet runs with.
const defaultUnreachableAfter = 10 * time.Second

// serverLog follows the log of one mci-apiserver from the moment it is
// made: what the server logged before is not the test's business.
type serverLog struct {
	name   string
	path   string
	pid    int
	offset int64
}

func followLog(t *testing.T, cs *localclusterset.ClusterSet, process string) *serverLog {
	t.Helper()
	for _, p := range cs.Processes() {
		if p.Name == process {
			info, err := os.Stat(p.Log)
			require.NoError(t, err)
			return &serverLog{name: p.Name, path: p.Log, pid: p.PID, offset: info.Size()}
		}
	}
	t.Fatalf("no process %s in the ClusterSet", process)
	return nil
}

// lines returns the lines logged since followLog.
func (l *serverLog) lines(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(l.path)
	require.NoError(t, err)
	if int64(len(data)) < l.offset {
		return nil
	}
	return strings.Split(string(data[l.offset:]), "\n")
}

// waitFor waits until a line logged since followLog contains every one of
// parts, and returns it.
func (l *serverLog) waitFor(t *testing.T, timeout time.Duration, parts ...string) string {
	t.Helper()
	var found string
	waitfor.Eventually(t, t.Context(), timeout, func(context.Context) (bool, string) {
		for _, line := range l.lines(t) {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				found = line
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s logged no line with %q", l.name, parts)
	})
	return found
}

// requireNoPanicAndSamePID checks that the server neither panicked (a
// recovered panic in a handler is logged, not fatal) nor was replaced.
func (l *serverLog) requireNoPanicAndSamePID(t *testing.T, cs *localclusterset.ClusterSet) {
	t.Helper()
	for _, line := range l.lines(t) {
		assert.NotContains(t, strings.ToLower(line), "panic", "%s logged a panic", l.name)
	}
	for _, p := range cs.Processes() {
		if p.Name == l.name {
			assert.True(t, p.Alive, "%s is not running", l.name)
			assert.Equal(t, l.pid, p.PID, "%s was restarted", l.name)
		}
	}
}

// watchReadyz asks an mci-apiserver's /readyz every 200ms, as a kubelet's
// readiness probe would, until the returned stop is called; stop returns
// how many probes it made and the failures.
func watchReadyz(t *testing.T, port int) (stop func() (probes int, failures []string)) {
	t.Helper()
	client := directClient(t, nil)
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", port)
	done := make(chan struct{})
	var (
		mu       sync.Mutex
		failures []string
		probes   atomic.Int64
	)
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			probes.Add(1)
			resp, err := client.Get(url)
			if err != nil {
				mu.Lock()
				failures = append(failures, err.Error())
				mu.Unlock()
				continue
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				mu.Lock()
				failures = append(failures, resp.Status)
				mu.Unlock()
			}
		}
	})
	return func() (int, []string) {
		close(done)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return int(probes.Load()), failures
	}
}

// unusedLoopbackServer is an https:// URL on a loopback address where
// nothing listens: the port was free a moment ago and is left closed.
func unusedLoopbackServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.77:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "https://" + addr
}

// requestRecorder is an HTTPS server on loopback that answers every
// request 500 and remembers its method, path and Authorization header.
// client-go uses a kubeconfig's user credentials over TLS only, so it must
// be HTTPS to be sent any.
type requestRecorder struct {
	url string
	ca  []byte
	mu  sync.Mutex
	got []string
}

func startRequestRecorder(t *testing.T) *requestRecorder {
	t.Helper()
	r := &requestRecorder{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, req.Method+" "+req.URL.Path+" Authorization: "+req.Header.Get("Authorization"))
		r.mu.Unlock()
		http.Error(w, "recorded", http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	r.ca = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return r
}

func (r *requestRecorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// pluginKubeconfig is a one-context kubeconfig for the recorder whose
// user is user.
func pluginKubeconfig(t *testing.T, r *requestRecorder, user *clientcmdapi.AuthInfo) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: r.url, CertificateAuthorityData: r.ca}
	cfg.AuthInfos["u"] = user
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	data, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	return data
}

// memberKubeconfig returns the member kubeconfig of cluster from the
// harness's member directory, its cluster entry changed by edit.
func memberKubeconfig(t *testing.T, cs *localclusterset.ClusterSet, cluster string, edit func(*clientcmdapi.Cluster)) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cs.MembersDir(), cluster+".kubeconfig"))
	require.NoError(t, err)
	cfg, err := clientcmd.Load(data)
	require.NoError(t, err)
	for _, c := range cfg.Clusters {
		edit(c)
	}
	out, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	return out
}

func memberSecret(name, cluster string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: localclusterset.MCIAPIServerNamespace, Labels: map[string]string{clusterset.MemberClusterLabel: cluster}},
		Data:       data,
	}
}

// exportStatus returns, for the InferencePoolExport namespace/name in c,
// each other cluster's reason.
func exportStatus(ctx context.Context, c *cluster, namespace, name string) (map[string]string, error) {
	exp, err := c.mci.InferenceV1alpha1().InferencePoolExports(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, cl := range exp.Status.Clusters {
		out[cl.Name] = cl.Reason
	}
	return out, nil
}

// Bad member Secrets in the running cluster-b: kubeconfigs that are not
// kubeconfigs, that cannot make a client, that would run a command or send
// a file of the server, a cluster name that is no name, two Secrets for
// one cluster, a Secret that claims to be cluster-b itself and one whose
// server is a loopback address where nothing listens. Each is reported in
// a structured log line and none stops cluster-b serving
// what the good members export: its /readyz stays ok, its imports from
// cluster-a and cluster-c stay Ready, the duplicate name is read through
// the first Secret by name, and the dead member is flagged
// ClusterUnreachable in cluster-b's InferencePoolExport after the
// threshold. Nothing panics; the server is never restarted.
//
// The first Secret for cluster-twin reaches cluster-c, a member already:
// a second name for one cluster, which would count cluster-c's exports
// twice. That member speaks for another cluster (its cluster ID, the uid
// of its kube-system Namespace, is cluster-c's, and so its cluster summary
// names cluster-c) and is refused: frozen, logged, counted in
// mci_clusterset_member_frozen, nothing of it served, flagged in the
// InferencePoolExports' status. The refusal also says which Secret is
// used: the second one's server does not answer, and could not be frozen
// for what it says.
func TestBadMemberSecretsAreReportedAndServingGoesOn(t *testing.T) {
	ctx := t.Context()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-bad-members"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	a.createEPPService(t, ctx, ns, "127.0.0.13")
	a.setEPPEndpoint(t, ctx, ns, true)
	c.createEPPService(t, ctx, ns, "127.0.0.14")
	c.setEPPEndpoint(t, ctx, ns, true)
	for _, cl := range []*cluster{a, b, c} {
		_, err := cl.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "from-"+strings.TrimPrefix(cl.name, "cluster-"), v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	waitForImportClusters(t, ctx, b, ns, "from-a", "cluster-a:Ready")
	waitForImportClusters(t, ctx, b, ns, "from-c", "cluster-c:Ready")

	bServer, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)
	log := followLog(t, clusters, "cluster-b-mci-apiserver")
	// The harness calls the ClusterSet up once the aggregator reaches the
	// server, which may be before its /readyz first passes: until then, a
	// member that does not answer holds it back by design (for the
	// unreachable threshold), which is not what this test is about.
	readyz := directClient(t, nil)
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		resp, err := readyz.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", bServer.MCIAPIServerReplicaPorts[0]))
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	stopReadyz := watchReadyz(t, bServer.MCIAPIServerReplicaPorts[0])

	dead := unusedLoopbackServer(t)
	// Two kubeconfigs that are not self-contained, both for a server that
	// records what it is sent: one that would make cluster-b's server run
	// a command, one that would make it send one of its own files (here a
	// stand-in for its ServiceAccount token) as a bearer token.
	recorder := startRequestRecorder(t)
	files := t.TempDir()
	ran := filepath.Join(files, "exec-plugin-ran")
	tokenFile := filepath.Join(files, "token")
	const fileToken = "mci-e2e-server-file-7e31"
	require.NoError(t, os.WriteFile(tokenFile, []byte(fileToken), 0o644))
	execKubeconfig := pluginKubeconfig(t, recorder, &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh", Args: []string{"-c", "touch " + ran},
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}})
	tokenFileKubeconfig := pluginKubeconfig(t, recorder, &clientcmdapi.AuthInfo{TokenFile: tokenFile})
	twin := memberKubeconfig(t, clusters, "cluster-c", func(*clientcmdapi.Cluster) {})
	secrets := []*corev1.Secret{
		memberSecret("bad-garbage", "cluster-garbage", map[string][]byte{clusterset.MemberKubeconfigKey: []byte("\x00\x01{not: yaml: [")}),
		memberSecret("bad-empty", "cluster-empty", map[string][]byte{clusterset.MemberKubeconfigKey: {}}),
		memberSecret("bad-no-key", "cluster-no-key", map[string][]byte{"config": twin}),
		memberSecret("bad-no-context", "cluster-no-context", map[string][]byte{clusterset.MemberKubeconfigKey: []byte("apiVersion: v1\nkind: Config\nclusters: []\n")}),
		memberSecret("bad-name", "Not_A_Cluster_Name", map[string][]byte{clusterset.MemberKubeconfigKey: twin}),
		memberSecret("bad-ca", "cluster-bad-ca", map[string][]byte{clusterset.MemberKubeconfigKey: memberKubeconfig(t, clusters, "cluster-c", func(c *clientcmdapi.Cluster) {
			c.CertificateAuthorityData = []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
		})}),
		memberSecret("bad-url", "cluster-bad-url", map[string][]byte{clusterset.MemberKubeconfigKey: memberKubeconfig(t, clusters, "cluster-c", func(c *clientcmdapi.Cluster) {
			c.Server = "https://127.0.0.1:port"
		})}),
		// Two Secrets for one cluster: the first by name is used.
		memberSecret("twin-1", "cluster-twin", map[string][]byte{clusterset.MemberKubeconfigKey: twin}),
		memberSecret("twin-2", "cluster-twin", map[string][]byte{clusterset.MemberKubeconfigKey: memberKubeconfig(t, clusters, "cluster-c", func(c *clientcmdapi.Cluster) { c.Server = dead })}),
		memberSecret("bad-exec", "cluster-exec", map[string][]byte{clusterset.MemberKubeconfigKey: execKubeconfig}),
		memberSecret("bad-token-file", "cluster-token-file", map[string][]byte{clusterset.MemberKubeconfigKey: tokenFileKubeconfig}),
		// cluster-b itself, pointing at cluster-a.
		memberSecret("claims-local", "cluster-b", map[string][]byte{clusterset.MemberKubeconfigKey: memberKubeconfig(t, clusters, "cluster-a", func(*clientcmdapi.Cluster) {})}),
		memberSecret("dead", "cluster-dead", map[string][]byte{clusterset.MemberKubeconfigKey: memberKubeconfig(t, clusters, "cluster-a", func(c *clientcmdapi.Cluster) { c.Server = dead })}),
	}
	api := b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace)
	deleteSecrets := func() {
		for _, s := range secrets {
			_ = api.Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		}
	}
	t.Cleanup(deleteSecrets)
	added := time.Now()
	for _, s := range secrets {
		_, err := api.Create(ctx, s, metav1.CreateOptions{})
		require.NoError(t, err, "Secret %s", s.Name)
	}

	t.Run("each bad Secret is reported in a structured log line", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			parts []string
		}{
			{"garbage", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-garbage"`, `source="secrets:mci-system"`, "invalid kubeconfig"}},
			{"an empty kubeconfig", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-empty"`, "kubeconfig is empty"}},
			{"no kubeconfig key", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-no-key"`, `has no \"kubeconfig\" key`}},
			{"no current context", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-no-context"`}},
			{"an invalid cluster name", []string{`"Ignoring member Secret with an invalid cluster name"`, `secret="mci-system/bad-name"`, `cluster="Not_A_Cluster_Name"`}},
			{"a CA that is no certificate", []string{`"Cannot connect to member"`, `member="cluster-bad-ca"`}},
			{"a server that is no URL", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-bad-url"`, "the resolved server is not a URL"}},
			{"a second Secret for a cluster", []string{`"Ignoring member Secret: another Secret already names this cluster"`, `secret="mci-system/twin-2"`, `cluster="cluster-twin"`}},
			{"an exec plugin", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-exec"`, "must be self-contained", "exec runs a command"}},
			{"a token file", []string{`"Ignoring member with an invalid kubeconfig"`, `member="cluster-token-file"`, "must be self-contained", "tokenFile names a file"}},
			{"a Secret naming the local cluster", []string{`"Ignoring a member kubeconfig that names the local cluster`, `cluster="cluster-b"`, `source="secrets:mci-system"`}},
		} {
			line := log.waitFor(t, convergence, tc.parts...)
			t.Logf("%s: %s", tc.name, line)
		}
	})

	t.Run("a kubeconfig from a Secret runs nothing and sends no file of the server", func(t *testing.T) {
		// Members of one report connect one after the other, by name, and
		// connecting asks the member what it serves: by the time
		// cluster-twin joined, cluster-exec and cluster-token-file would
		// have made their first requests.
		log.waitFor(t, convergence, `"Member joined the ClusterSet"`, `member="cluster-twin"`)
		_, err := os.Stat(ran)
		assert.True(t, os.IsNotExist(err), "the exec plugin ran (stat: %v)", err)
		leaked := 0
		for _, r := range recorder.requests() {
			if strings.Contains(r, fileToken) {
				leaked++
			}
		}
		assert.Zero(t, leaked, "requests that carried the server's own file as a bearer token")
		assert.Empty(t, recorder.requests(), "no request went to the server of a refused kubeconfig")
	})

	t.Run("a cluster named twice is read through the first Secret by name, and refused as a second name for cluster-c", func(t *testing.T) {
		line := waitForIdentityRefusal(t, log, "cluster-b", "cluster-twin", "cluster-c")
		t.Logf("refused: %s", line)
		waitForImportClusters(t, ctx, b, ns, "from-c", "cluster-c:Ready")
	})

	t.Run("a member where nothing listens is flagged after the threshold", func(t *testing.T) {
		waitfor.Eventually(t, ctx, defaultUnreachableAfter+convergence, func(ctx context.Context) (bool, string) {
			st, err := exportStatus(ctx, b, ns, "from-b")
			if err != nil {
				return false, err.Error()
			}
			return st["cluster-dead"] == v1alpha1.ReasonClusterUnreachable, fmt.Sprintf("%v", st)
		})
		// When the server flagged it, by its log line's stamp: the time
		// this subtest took to look includes the subtests before it.
		line := log.waitFor(t, convergence, `"Member reachability changed"`, `member="cluster-dead"`, "unreachable=true")
		flagged := klogTime(t, line, added).Sub(added)
		t.Logf("cluster-dead flagged unreachable by cluster-b's mci-apiserver %s after its Secret was created (threshold %s)", flagged.Round(100*time.Millisecond), defaultUnreachableAfter)
		assert.GreaterOrEqual(t, flagged, defaultUnreachableAfter, "flagged no earlier than its threshold")
	})

	t.Run("serving went on for every good member", func(t *testing.T) {
		// A bad Secret never replaces a good member nor the local
		// cluster: cluster-b imports from cluster-a alone, and exports
		// its own pool to the members it has.
		assert.Never(t, func() bool {
			fromA, errA := b.importOf(ctx, ns, "from-a")
			fromC, errC := b.importOf(ctx, ns, "from-c")
			return errA != nil || errC != nil || importClusters(fromA) != "cluster-a:Ready" || importClusters(fromC) != "cluster-c:Ready"
		}, 3*time.Second, 200*time.Millisecond, "cluster-c's pool is imported once, from cluster-c")
		own, err := b.importOf(ctx, ns, "from-b")
		require.NoError(t, err)
		assert.Nil(t, own, "cluster-b does not import its own pool, whatever a Secret claims")
		st, err := exportStatus(ctx, b, ns, "from-b")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{
			"cluster-a":    v1alpha1.ReasonImported,
			"cluster-c":    v1alpha1.ReasonImported,
			"cluster-twin": v1alpha1.ReasonClusterUnreachable,
			"cluster-dead": v1alpha1.ReasonClusterUnreachable,
		}, st, "the members cluster-b has: the bad Secrets added none, the refused and the dead one are flagged")
		probes, failures := stopReadyz()
		t.Logf("cluster-b mci-apiserver /readyz: %d probes, %d failed", probes, len(failures))
		assert.Empty(t, failures, "readiness must not follow bad or dead members")
		assert.NotZero(t, probes)
		log.requireNoPanicAndSamePID(t, clusters)
	})

	t.Run("the members the Secrets added leave with them", func(t *testing.T) {
		deleteSecrets()
		waitForImportClusters(t, ctx, b, ns, "from-c", "cluster-c:Ready")
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			st, err := exportStatus(ctx, b, ns, "from-b")
			if err != nil {
				return false, err.Error()
			}
			_, dead := st["cluster-dead"]
			return !dead && len(st) == 2, fmt.Sprintf("%v", st)
		})
		log.requireNoPanicAndSamePID(t, clusters)
	})
}

// waitForIdentityRefusal waits until cluster's mci-apiserver has refused
// member for speaking for another cluster (its cluster ID is that of
// member speaksFor, or its cluster summary names speaksFor: either line
// names it): the log line, and mci_clusterset_member_frozen on every
// replica. It returns the log line.
func waitForIdentityRefusal(t *testing.T, log *serverLog, cluster, member, speaksFor string) string {
	t.Helper()
	line := log.waitFor(t, convergence, `"Member frozen: it speaks for another cluster`, `member="`+member+`"`, `quota="identity"`, `named \"`+speaksFor+`\"`)
	series := `mci_clusterset_member_frozen{member="` + member + `",quota="identity"}`
	for i, metric := range replicaMetrics(t, clusters, cluster) {
		waitfor.Eventually(t, t.Context(), convergence, func(ctx context.Context) (bool, string) {
			v := metric(t, ctx, series)
			return v == 1, fmt.Sprintf("replica %d: %s %v", i, series, v)
		})
	}
	return line
}

// klogTime reads the time stamp of a klog line ("I1202 03:12:34.567890
// ..."), which carries no year: the year is near's.
func klogTime(t *testing.T, line string, near time.Time) time.Time {
	t.Helper()
	require.Greater(t, len(line), len("I0102 15:04:05.000000"), "a klog line: %q", line)
	at, err := time.ParseInLocation("0102 15:04:05.000000", line[1:len("I0102 15:04:05.000000")], time.Local)
	require.NoError(t, err, "the time stamp of %q", line)
	return at.AddDate(near.Year(), 0, 0)
}

// removeAfter and removeUnreachableAfter are the thresholds of the
// ClusterSet of TestAnUnreachableMemberIsFlaggedThenRemovedThroughTheAggregator:
// short, so that the test stays quick, and far enough apart to tell which
// one acted.
const (
	removeUnreachableAfter = 2 * time.Second
	removeAfter            = 8 * time.Second
)

// A member that stays unreachable: after --member-unreachable-after its
// clusters' entries are flagged (Ready=False, ClusterUnreachable) with the
// last known data kept; after --member-remove-after they are removed: an
// import only it exported goes away, an import another member also
// exports loses its entry. Watchers through the aggregator see each step,
// and the reverse when the member answers again.
func TestAnUnreachableMemberIsFlaggedThenRemovedThroughTheAggregator(t *testing.T) {
	cs := startClusterSet(t, "mci-e2e-remove-", localclusterset.Options{
		Clusters:               []string{"cluster-a", "cluster-b", "cluster-c"},
		MemberUnreachableAfter: removeUnreachableAfter,
		MemberRemoveAfter:      removeAfter,
	})
	ctx := t.Context()
	a, b, c := clientsIn(t, cs, "cluster-a"), clientsIn(t, cs, "cluster-b"), clientsIn(t, cs, "cluster-c")
	const ns = "e2e-remove"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	for _, cl := range []*cluster{a, c} {
		cl.createEPPService(t, ctx, ns, "127.0.0.15")
		cl.setEPPEndpoint(t, ctx, ns, true)
	}
	for _, p := range []struct {
		in   *cluster
		name string
	}{{a, "only-a"}, {a, "shared"}, {c, "shared"}} {
		_, err := p.in.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, p.name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	waitForImportClusters(t, ctx, b, ns, "only-a", "cluster-a:Ready")
	waitForImportClusters(t, ctx, b, ns, "shared", "cluster-a:Ready,cluster-c:Ready")

	imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)
	list, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	watched := &watchHistory{byName: map[string][]sighting{}}
	go watched.record(w)

	// The stop blocks while kube-apiserver shuts down gracefully (up to
	// the harness's 15s grace), which it begins by failing /readyz: the
	// member is unreachable from the moment the stop begins, and the
	// watcher's history, stamped as events arrive, is what tells when it
	// was flagged and removed.
	stopping := time.Now()
	require.NoError(t, cs.StopAPIServer("cluster-a"))
	restarted := false
	defer func() {
		if !restarted {
			_ = cs.StartAPIServer(context.Background(), "cluster-a")
		}
	}()
	t.Logf("cluster-a's kube-apiserver stopped (its graceful stop took %s)", time.Since(stopping).Round(10*time.Millisecond))
	unreachable := "cluster-a:" + v1alpha1.ReasonClusterUnreachable

	t.Run("first flagged ClusterUnreachable, the last known data kept", func(t *testing.T) {
		flagged := watched.wait(t, "only-a", watch.Modified, unreachable, removeAfter)
		watched.wait(t, "shared", watch.Modified, unreachable+",cluster-c:Ready", removeAfter)
		t.Logf("flagged %s after the stop began (threshold %s)", flagged.at.Sub(stopping).Round(10*time.Millisecond), removeUnreachableAfter)
		// The member fails from its last answer, up to a probe interval
		// (1s) before the stop began.
		assert.Less(t, flagged.at.Sub(stopping), removeUnreachableAfter+time.Second, "flagged within the threshold + 1s")
		entry := flagged.imp.Status.Clusters[0]
		require.NotEmpty(t, entry.EndpointPicker.Service)
		assert.Equal(t, []string{"127.0.0.15"}, entry.EndpointPicker.Service[0].Addresses, "the last known data is kept")
		assert.Equal(t, metav1.ConditionFalse, entry.Conditions[0].Status)
		assert.Contains(t, entry.Conditions[0].Message, "serving its last known data")
	})

	t.Run("then removed after --member-remove-after", func(t *testing.T) {
		removed := watched.wait(t, "only-a", watch.Deleted, "", removeAfter+convergence)
		watched.wait(t, "shared", watch.Modified, "cluster-c:Ready", convergence)
		t.Logf("removed %s after the stop began (threshold %s)", removed.at.Sub(stopping).Round(10*time.Millisecond), removeAfter)
		assert.GreaterOrEqual(t, removed.at.Sub(stopping), removeAfter-2*time.Second, "removed by the removal threshold, not the unreachable one")
		assert.Less(t, removed.at.Sub(stopping), removeAfter+time.Second, "removed within the threshold + 1s")
		gone, err := b.importOf(ctx, ns, "only-a")
		require.NoError(t, err)
		assert.Nil(t, gone, "GET: the import only cluster-a exported is gone")
		list, err := imports.List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		require.Len(t, list.Items, 1)
		assert.Equal(t, "shared", list.Items[0].Name)
		assert.Equal(t, "cluster-c:Ready", importClusters(&list.Items[0]))
		st, err := exportStatus(ctx, c, ns, "shared")
		require.NoError(t, err)
		assert.Equal(t, v1alpha1.ReasonClusterUnreachable, st["cluster-a"], "cluster-c's export still names cluster-a, as unreachable")
	})

	t.Run("and back when the member answers again", func(t *testing.T) {
		require.NoError(t, cs.StartAPIServer(ctx, "cluster-a"))
		restarted = true
		back := watched.wait(t, "only-a", watch.Added, "", 2*convergence)
		t.Logf("the import came back as %s", importClusters(back.imp))
		waitForImportClusters(t, ctx, b, ns, "only-a", "cluster-a:Ready")
		waitForImportClusters(t, ctx, b, ns, "shared", "cluster-a:Ready,cluster-c:Ready")
	})
}

// sighting is one event a watcher saw, stamped when it arrived.
type sighting struct {
	typ watch.EventType
	imp *v1alpha1.InferencePoolImport
	at  time.Time
}

// watchHistory records what a watch of imports delivers, per import and
// in order: events of different imports may arrive in any order.
type watchHistory struct {
	mu     sync.Mutex
	byName map[string][]sighting
}

func (h *watchHistory) record(w watch.Interface) {
	for ev := range w.ResultChan() {
		imp, ok := ev.Object.(*v1alpha1.InferencePoolImport)
		if !ok || ev.Type == watch.Bookmark {
			continue
		}
		h.mu.Lock()
		h.byName[imp.Name] = append(h.byName[imp.Name], sighting{ev.Type, imp, time.Now()})
		h.mu.Unlock()
	}
}

// wait waits until the watcher saw an event of typ for name whose
// clusters are state ("" for any), after whatever wait found before for
// name, and returns it.
func (h *watchHistory) wait(t *testing.T, name string, typ watch.EventType, state string, timeout time.Duration) sighting {
	t.Helper()
	var found sighting
	waitfor.Eventually(t, t.Context(), timeout, func(context.Context) (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		var got []string
		for i, s := range h.byName[name] {
			if s.typ == typ && (state == "" || importClusters(s.imp) == state) {
				found = s
				// Later waits look only at what came after.
				h.byName[name] = h.byName[name][i+1:]
				return true, ""
			}
			got = append(got, fmt.Sprintf("%s %s", s.typ, importClusters(s.imp)))
		}
		return false, fmt.Sprintf("%s: saw %q, not %s %s", name, got, typ, state)
	})
	return found
}

// startClusterSet starts a ClusterSet of its own for one test, with the
// mci-apiserver of the shared one, and stops it when the test ends.
func startClusterSet(t *testing.T, prefix string, opts localclusterset.Options) *localclusterset.ClusterSet {
	t.Helper()
	binDir, err := localclusterset.BinDir()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", prefix)
	require.NoError(t, err)
	opts.Dir, opts.BinDir, opts.Log = dir, binDir, testWriter{t}
	opts.MCIAPIServerBinary = filepath.Join(binDir, "mci-apiserver")
	start := time.Now()
	upCtx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(upCtx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, cs.Stop())
		if t.Failed() {
			t.Logf("ClusterSet logs kept in %s", filepath.Join(dir, "logs"))
			return
		}
		_ = os.RemoveAll(dir)
	})
	t.Logf("ClusterSet %s up in %s", strings.Join(cs.Names(), ", "), time.Since(start).Round(time.Second))
	return cs
}
