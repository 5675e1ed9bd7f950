package podstart

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"

	clusterinventory "github.com/mci-dev/mci/pkg/apis/clusterinventory/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
)

const (
	// fleetNamespace holds the ClusterProfiles on the hub (the chart's
	// cluster), as testdata/clusterprofiles.yaml says.
	fleetNamespace = "fleet"
	// clusterSetName is the ClusterSet's name of a chart with no
	// ClusterProperty clusterset.k8s.io.
	clusterSetName = "default"
	// pluginsMount is where the chart mounts the plugins volume.
	pluginsMount = "/plugins"
)

// clusterProfiles makes memberCluster a member of the chart's cluster
// through a ClusterProfile on it, as a cluster manager would publish: its
// access provider "token" names memberCluster's server and CA, and its exec
// extension the file of a token of a ServiceAccount of memberCluster bound
// to the member-reader roles. The exec plugin, built static for the image
// (which has no C library), and that token go into the hostPath volume the
// chart mounts at /plugins.
func clusterProfiles(t *testing.T, ctx context.Context, f *fixture) []string {
	t.Helper()
	args := memberSecretless(t, ctx, f)
	member, err := f.cs.Cluster(memberCluster)
	require.NoError(t, err)

	plugins := t.TempDir()
	require.NoError(t, os.Chmod(plugins, 0o755))
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(plugins, "mci-test-exec-plugin"), "./test/cmd/mci-test-exec-plugin")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building the exec plugin: %s", out)

	memberKube := kubernetes.NewForConfigOrDie(member.Config)
	const reader = "mci-clusterprofile-reader"
	_, err = memberKube.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: reader}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, role := range []string{"mci-member-summary-reader", "mci-member-reader"} {
		_, err := memberKube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reader + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: reader, Namespace: metav1.NamespaceDefault}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	tr, err := memberKube.CoreV1().ServiceAccounts(metav1.NamespaceDefault).CreateToken(ctx, reader, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(plugins, memberCluster+".token"), []byte(tr.Status.Token), 0o644))

	// The hub: the ClusterProfile CRD (the e2e tests' fixture) and the
	// fleet's namespace, where the chart renders the reader Role.
	_, err = f.cs.ApplyFiles(ctx, f.cluster.Name, filepath.Join("..", "e2e", "testdata", "crds"))
	require.NoError(t, err)
	_, err = f.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: fleetNamespace, Labels: map[string]string{clusterinventory.LabelClusterSet: clusterSetName},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	profiles := mciclient.NewForConfigOrDie(f.cluster.Config).ClusterInventoryV1alpha1().ClusterProfiles(fleetNamespace)
	var p *clusterinventory.ClusterProfile
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err = profiles.Create(ctx, &clusterinventory.ClusterProfile{
			ObjectMeta: metav1.ObjectMeta{Name: memberCluster, Labels: map[string]string{clusterinventory.LabelClusterSet: clusterSetName}},
			Spec:       clusterinventory.ClusterProfileSpec{ClusterManager: clusterinventory.ClusterManager{Name: "podstart"}},
		}, metav1.CreateOptions{})
		return err == nil, nil
	})
	require.NoError(t, err, "creating the ClusterProfile once its CRD is served")
	extension, err := json.Marshal(map[string]string{"tokenFile": pluginsMount + "/" + memberCluster + ".token"})
	require.NoError(t, err)
	p.Status = clusterinventory.ClusterProfileStatus{
		Conditions: []metav1.Condition{{Type: clusterinventory.ConditionControlPlaneHealthy, Status: metav1.ConditionTrue, Reason: "PodStart", Message: "healthy", LastTransitionTime: metav1.Now()}},
		AccessProviders: []clusterinventory.AccessProvider{{Name: "token", Cluster: clientcmdv1.Cluster{
			Server:                   member.Server,
			CertificateAuthorityData: member.Config.CAData,
			Extensions:               []clientcmdv1.NamedExtension{{Name: "client.authentication.k8s.io/exec", Extension: runtime.RawExtension{Raw: extension}}},
		}}},
	}
	_, err = profiles.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err)
	return append(args, "--set", "membership.clusterProfiles.pluginsVolume.hostPath.path="+plugins)
}
