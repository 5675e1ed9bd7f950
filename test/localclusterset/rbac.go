package localclusterset

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// memberReaderRules is what an mci-apiserver may do in the clusters it
// watches, per the Membership contract: read the six kinds the import
// computation uses, nothing else. A member kubeconfig that could do more
// would hide a server that asks for more.
var memberReaderRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"namespaces", "services", "pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gateways", "backendtlspolicies"}, Verbs: []string{"get", "list", "watch"}},
}

// memberSummaryReaderRules is what an mci-apiserver may do in the
// clusters it reads in summary mode: read the summaries their own
// mci-apiservers publish, and the kube-system Namespace whose uid is the
// cluster's ID, nothing else. artifacts/deploy/mci-apiserver
// grants exactly these to the identity it hands to other members.
var memberSummaryReaderRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"inference.networking.x-k8s.io"}, Resources: []string{"inferencepoolexportsummaries", "inferenceclustersummaries"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
}

// memberSummaryReader names the ClusterRole of memberSummaryReaderRules.
const memberSummaryReader = "mci-member-summary-reader"

// LocalRouteReaderRules is what an mci-apiserver reads in its own cluster
// only, beyond memberReaderRules: the HTTPRoutes and ReferenceGrants that
// make an import's parents. artifacts/deploy/mci-apiserver/20-rbac.yaml
// grants exactly these (a test keeps the two identical); the e2e tests
// check through SubjectAccessReviews that the deployed ServiceAccount may
// read and not write them.
var LocalRouteReaderRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"httproutes", "referencegrants"}, Verbs: []string{"get", "list", "watch"}},
}

// ExportedStatusWriterRules and ExportedStatusElectionRules are mci's one
// write, in its own cluster only: the Exported status of its exported
// InferencePools, and the Lease (in its namespace) that elects the replica
// that writes it. artifacts/deploy/mci-apiserver/20-rbac.yaml grants
// exactly these (a test keeps them identical); the deploy e2e test checks
// through SubjectAccessReviews what they allow and refuse. The harness's
// mci-apiservers reach their own cluster as its admin.
var (
	ExportedStatusWriterRules = []rbacv1.PolicyRule{
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools/status"}, Verbs: []string{"get", "patch", "update"}},
	}
	ExportedStatusElectionRules = []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}
)

// grantMemberReader creates the ClusterRoles of memberSummaryReaderRules
// and memberReaderRules, as the deployment manifests do, and binds the
// first and, unless summaryOnly, the second to the identity of the
// members/ kubeconfigs.
func grantMemberReader(ctx context.Context, kube kubernetes.Interface, summaryOnly bool) error {
	if err := grantRole(ctx, kube, memberSummaryReader, memberSummaryReaderRules, true); err != nil {
		return err
	}
	return grantRole(ctx, kube, memberReaderUser, memberReaderRules, !summaryOnly)
}

// grantRole creates the ClusterRole name with rules and, with bind, binds
// it to the identity of the members/ kubeconfigs.
func grantRole(ctx context.Context, kube kubernetes.Interface, name string, rules []rbacv1.PolicyRule, bind bool) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	if !bind {
		return nil
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: memberReaderUser}},
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

func ensureNamespace(ctx context.Context, kube kubernetes.Interface, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}
