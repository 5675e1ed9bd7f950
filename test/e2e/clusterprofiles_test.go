package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"k8s.io/client-go/util/retry"

	clusterinventory "github.com/mci-dev/mci/pkg/apis/clusterinventory/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// profileProvider is the access provider name the test's profiles offer
// and its provider file maps to the test exec plugin.
const profileProvider = "e2e-token"

// profileFixture is a hub (cluster-a) holding ClusterProfiles for
// cluster-b's mci-apiserver, a real exec plugin that hands out
// ServiceAccount tokens of cluster-c, and the log of what the plugin was
// given.
type profileFixture struct {
	hub, member *cluster
	dir         string
	pluginLog   string
	fleet       string
}

// ClusterProfiles on a hub are members: cluster-c joins cluster-b's
// ClusterSet through its profile and a token from the operator's exec
// plugin, reconnects when the profile's access data changes, and leaves
// when its profile loses the ClusterSet label or is deleted.
func TestClusterProfileMembersJoinRotateAndLeave(t *testing.T) {
	ctx := context.Background()
	f := newProfileFixture(t, ctx)
	b := clusterClients(t, "cluster-b")
	const ns = "e2e-profiles"
	b.createNamespace(t, ctx, ns)
	f.member.createNamespace(t, ctx, ns)
	_, err := f.member.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeParent), metav1.CreateOptions{})
	require.NoError(t, err)
	joined := "cluster-c:" + v1alpha1.ReasonNoReadyParents
	waitForImportClusters(t, ctx, b, ns, "llm", joined)

	// cluster-c leaves the member directory; cluster-b's server now reads
	// the hub's ClusterProfiles too.
	parkMemberKubeconfig(t, "cluster-c")
	f.startProfileMembership(t, ctx)
	waitForImportClusters(t, ctx, b, ns, "llm", "<none>")

	// Join: the profile appears, with an unhealthy control plane (a hint
	// only) and an environment variable of its own that the operator's
	// policy lets through.
	token1 := f.serviceAccountToken(t, ctx, "profile-reader-1")
	f.createProfile(t, ctx, "cluster-c", token1)
	waitForImportClusters(t, ctx, b, ns, "llm", joined)
	f.waitPluginCall(t, ctx, token1)

	// Rotate: new credentials in the profile's extension data; the old
	// token is then revoked, and the member keeps serving.
	token2 := f.serviceAccountToken(t, ctx, "profile-reader-2")
	f.setProfileTokenFile(t, ctx, "cluster-c", token2)
	f.waitPluginCall(t, ctx, token2)
	require.NoError(t, f.member.kube.CoreV1().ServiceAccounts(f.fleet).Delete(ctx, "profile-reader-1", metav1.DeleteOptions{}))
	waitfor.Eventually(t, ctx, convergence, f.tokenRefused(token1))
	waitForImportClusters(t, ctx, b, ns, "llm", joined)
	waitfor.Consistently(t, ctx, 3*time.Second, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, "llm")
		return err == nil && importClusters(imp) == joined, importClusters(imp)
	})

	// Drain: the profile's drain annotation flags cluster-c's export
	// Draining in cluster-b's import, as the member's; without it, the
	// drain ends.
	f.updateProfile(t, ctx, "cluster-c", false, func(p *clusterinventory.ClusterProfile) {
		p.Annotations = map[string]string{v1alpha1.DrainAnnotation: "true"}
	})
	waitForDrainReason(t, ctx, b, ns, "llm", "cluster-c", v1alpha1.ReasonMemberDrainRequested)
	f.updateProfile(t, ctx, "cluster-c", false, func(p *clusterinventory.ClusterProfile) {
		delete(p.Annotations, v1alpha1.DrainAnnotation)
	})
	waitForDrainReason(t, ctx, b, ns, "llm", "cluster-c", "")
	waitForImportClusters(t, ctx, b, ns, "llm", joined)

	// Leave: without the ClusterSet label, then deleted.
	f.setProfileLabel(t, ctx, "cluster-c", "other-clusterset")
	waitForImportClusters(t, ctx, b, ns, "llm", "<none>")
	f.setProfileLabel(t, ctx, "cluster-c", localclusterset.ClusterSetName)
	waitForImportClusters(t, ctx, b, ns, "llm", joined)
	require.NoError(t, f.hub.mci.ClusterInventoryV1alpha1().ClusterProfiles(f.fleet).Delete(ctx, "cluster-c", metav1.DeleteOptions{}))
	waitForImportClusters(t, ctx, b, ns, "llm", "<none>")
}

// waitForDrainReason waits until the import's entry of cluster has a
// Draining condition of that reason ("": none).
func waitForDrainReason(t *testing.T, ctx context.Context, in *cluster, ns, name, cluster, reason string) {
	t.Helper()
	waitfor.Eventually(t, ctx, convergence*2, func(ctx context.Context) (bool, string) {
		imp, err := in.importOf(ctx, ns, name)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("no import: %v", err)
		}
		for _, c := range imp.Status.Clusters {
			if c.Name != cluster {
				continue
			}
			got := ""
			if d := meta.FindStatusCondition(c.Conditions, v1alpha1.ConditionDraining); d != nil && d.Status == metav1.ConditionTrue {
				got = d.Reason
			}
			return got == reason, "Draining reason " + got
		}
		return false, "no entry of " + cluster
	})
}

func newProfileFixture(t *testing.T, ctx context.Context) *profileFixture {
	t.Helper()
	f := &profileFixture{
		hub:    clusterClients(t, "cluster-a"),
		member: clusterClients(t, "cluster-c"),
		dir:    t.TempDir(),
		fleet:  "e2e-fleet",
	}
	f.pluginLog = filepath.Join(f.dir, "plugin.log")
	_, err := clusters.ApplyFiles(ctx, "cluster-a", filepath.Join("testdata", "crds"))
	require.NoError(t, err)
	f.hub.createNamespace(t, ctx, f.fleet)
	f.member.createNamespace(t, ctx, f.fleet)
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		_, err := f.hub.mci.ClusterInventoryV1alpha1().ClusterProfiles(f.fleet).List(ctx, metav1.ListOptions{})
		return err == nil, errString(err)
	})
	return f
}

// startProfileMembership builds the exec plugin, writes the operator's
// provider file and restarts cluster-b's mci-apiserver with the
// ClusterProfile flags, until the test ends.
func (f *profileFixture) startProfileMembership(t *testing.T, ctx context.Context) {
	t.Helper()
	plugin := filepath.Join(f.dir, "mci-test-exec-plugin")
	build := exec.CommandContext(ctx, "go", "build", "-o", plugin, "./test/cmd/mci-test-exec-plugin")
	build.Dir = filepath.Join("..", "..")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))
	providers := map[string]any{"providers": []any{map[string]any{
		"name": profileProvider,
		"execConfig": map[string]any{
			"apiVersion":         "client.authentication.k8s.io/v1",
			"command":            plugin,
			"args":               []string{"--from-operator"},
			"env":                []map[string]string{{"name": "MCI_TEST_EXEC_PLUGIN_LOG", "value": f.pluginLog}},
			"provideClusterInfo": true,
		},
		"profileSourcedEnvVarsPolicy": "AppendIfNotExists",
		"profileSourcedEnvVarNames":   []string{"E2E_FROM_PROFILE"},
	}}}
	data, err := json.Marshal(providers)
	require.NoError(t, err)
	providerFile := filepath.Join(f.dir, "providers.json")
	require.NoError(t, os.WriteFile(providerFile, data, 0o600))
	hub, err := clusters.Cluster("cluster-a")
	require.NoError(t, err)
	require.NoError(t, clusters.RestartMCIAPIServerWithArgs(ctx, "cluster-b",
		"--clusterprofile-kubeconfig="+hub.Kubeconfig,
		"--clusterprofile-namespace="+f.fleet,
		"--clusterprofile-provider-file="+providerFile))
	t.Cleanup(func() {
		require.NoError(t, clusters.RestartMCIAPIServerWithArgs(context.Background(), "cluster-b"))
	})
}

// parkMemberKubeconfig takes a cluster's kubeconfig out of the member
// directory every mci-apiserver reads, until the test ends.
func parkMemberKubeconfig(t *testing.T, name string) {
	t.Helper()
	file := filepath.Join(clusters.MembersDir(), name+".kubeconfig")
	parked := filepath.Join(clusters.Dir, name+".kubeconfig.parked")
	require.NoError(t, os.Rename(file, parked))
	t.Cleanup(func() { require.NoError(t, os.Rename(parked, file)) })
}

// serviceAccountToken creates a ServiceAccount of cluster-c that may read
// what a member's reader reads, and writes a token of it to a file.
func (f *profileFixture) serviceAccountToken(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	kube := f.member.kube
	_, err := kube.CoreV1().ServiceAccounts(f.fleet).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindMemberReader(t, ctx, kube, f.fleet, name, t)
	tr, err := kube.CoreV1().ServiceAccounts(f.fleet).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	require.NoError(t, err)
	path := filepath.Join(f.dir, name+".token")
	require.NoError(t, os.WriteFile(path, []byte(tr.Status.Token), 0o600))
	return path
}

func (f *profileFixture) createProfile(t *testing.T, ctx context.Context, name, tokenFile string) {
	t.Helper()
	api := f.hub.mci.ClusterInventoryV1alpha1().ClusterProfiles(f.fleet)
	p, err := api.Create(ctx, &clusterinventory.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{clusterinventory.LabelClusterSet: localclusterset.ClusterSetName}},
		Spec:       clusterinventory.ClusterProfileSpec{ClusterManager: clusterinventory.ClusterManager{Name: "e2e"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	server, err := clusters.MemberServer("cluster-b", name)
	require.NoError(t, err)
	c, err := clusters.Cluster(name)
	require.NoError(t, err)
	p.Status = clusterinventory.ClusterProfileStatus{
		Conditions: []metav1.Condition{{Type: clusterinventory.ConditionControlPlaneHealthy, Status: metav1.ConditionFalse, Reason: "E2E", Message: "a hint only", LastTransitionTime: metav1.Now()}},
		AccessProviders: []clusterinventory.AccessProvider{{Name: profileProvider, Cluster: clientcmdv1.Cluster{
			Server:                   server,
			CertificateAuthorityData: c.Config.CAData,
			Extensions: []clientcmdv1.NamedExtension{
				{Name: "client.authentication.k8s.io/exec", Extension: runtime.RawExtension{Raw: tokenFileConfig(t, tokenFile)}},
				// The additional-args extension cannot go through the API: its
				// list is not the object the CRD's schema asks for.
				{Name: "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs", Extension: runtime.RawExtension{Raw: []byte(`{"E2E_FROM_PROFILE":"yes"}`)}},
			},
		}}},
	}
	_, err = api.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func tokenFileConfig(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := json.Marshal(map[string]string{"tokenFile": path})
	require.NoError(t, err)
	return raw
}

func (f *profileFixture) setProfileTokenFile(t *testing.T, ctx context.Context, name, tokenFile string) {
	t.Helper()
	f.updateProfile(t, ctx, name, true, func(p *clusterinventory.ClusterProfile) {
		p.Status.AccessProviders[0].Cluster.Extensions[0].Extension = runtime.RawExtension{Raw: tokenFileConfig(t, tokenFile)}
	})
}

func (f *profileFixture) setProfileLabel(t *testing.T, ctx context.Context, name, clusterSet string) {
	t.Helper()
	f.updateProfile(t, ctx, name, false, func(p *clusterinventory.ClusterProfile) {
		p.Labels[clusterinventory.LabelClusterSet] = clusterSet
	})
}

func (f *profileFixture) updateProfile(t *testing.T, ctx context.Context, name string, status bool, change func(*clusterinventory.ClusterProfile)) {
	t.Helper()
	api := f.hub.mci.ClusterInventoryV1alpha1().ClusterProfiles(f.fleet)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(p)
		if status {
			_, err = api.UpdateStatus(ctx, p, metav1.UpdateOptions{})
		} else {
			_, err = api.Update(ctx, p, metav1.UpdateOptions{})
		}
		return err
	}))
}

// waitPluginCall waits until the exec plugin has been run for cluster-c
// with the profile's extension data naming tokenFile, the operator's
// argument and the profile's environment variable.
func (f *profileFixture) waitPluginCall(t *testing.T, ctx context.Context, tokenFile string) {
	t.Helper()
	c, err := clusters.MemberServer("cluster-b", "cluster-c")
	require.NoError(t, err)
	waitfor.Eventually(t, ctx, convergence, func(context.Context) (bool, string) {
		calls, err := readPluginCalls(f.pluginLog)
		if err != nil {
			return false, err.Error()
		}
		for _, call := range calls {
			if call.Server == c && call.Config.TokenFile == tokenFile && strings.Join(call.Args, " ") == "--from-operator" && call.FromProfile == "yes" {
				return true, ""
			}
		}
		return false, "plugin calls: " + strings.Join(pluginCallStrings(calls), "; ")
	})
}

type pluginCall struct {
	Server string `json:"server"`
	Config struct {
		TokenFile string `json:"tokenFile"`
	} `json:"config"`
	Args        []string `json:"args"`
	FromProfile string   `json:"fromProfile"`
}

func readPluginCalls(path string) ([]pluginCall, error) {
	file, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var calls []pluginCall
	lines := bufio.NewScanner(file)
	for lines.Scan() {
		var c pluginCall
		if err := json.Unmarshal(lines.Bytes(), &c); err != nil {
			return nil, err
		}
		calls = append(calls, c)
	}
	return calls, lines.Err()
}

func pluginCallStrings(calls []pluginCall) []string {
	out := make([]string, 0, len(calls))
	for _, c := range calls {
		out = append(out, c.Server+" "+filepath.Base(c.Config.TokenFile)+" "+strings.Join(c.Args, " ")+" E2E_FROM_PROFILE="+c.FromProfile)
	}
	return out
}

// tokenRefused says when cluster-c no longer takes the token in file.
func (f *profileFixture) tokenRefused(file string) waitfor.Condition {
	return func(ctx context.Context) (bool, string) {
		token, err := os.ReadFile(file)
		if err != nil {
			return false, err.Error()
		}
		c, err := clusters.Cluster(f.member.name)
		if err != nil {
			return false, err.Error()
		}
		cfg := rest.AnonymousClientConfig(c.Config)
		cfg.BearerToken = string(token)
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return false, err.Error()
		}
		_, err = kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 1})
		return apierrors.IsUnauthorized(err), fmt.Sprintf("listing with the old token: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
