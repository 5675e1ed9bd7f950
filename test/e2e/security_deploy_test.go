package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	apiuser "k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/registry/inference/inferencepoolexportsummary"
	"github.com/mci-dev/mci/test/localclusterset"
)

const deployDir = "../../artifacts/deploy/mci-apiserver"

func readManifests(t *testing.T, paths ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, p := range paths {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		objs = append(objs, decodeManifests(t, data, p)...)
	}
	return objs
}

// decodeManifests decodes a multi-document YAML stream read from source.
func decodeManifests(t *testing.T, data []byte, source string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, source)
		if obj != nil {
			objs = append(objs, &unstructured.Unstructured{Object: obj})
		}
	}
	return objs
}

// The deployment manifests, as `kubectl apply -k` builds them, are applied
// to a real kube-apiserver, which
// validates every object (a pod template, a probe, a securityContext, RBAC
// role references, a PodDisruptionBudget). No kubelet runs, so no pod
// starts. The shared ClusterSet already runs an mci-apiserver in
// mci-system behind the same APIService name, so the manifests move to a
// namespace of their own, cluster-scoped names get a suffix, and the
// APIService, whose name cannot change, is applied as a server-side dry
// run: validated and admitted like the rest, not stored.
func TestSecurityDeploymentManifestsApplyToARealCluster(t *testing.T) {
	ctx := t.Context()
	b := clusterClients(t, "cluster-b")
	kb, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)
	dyn := dynamic.NewForConfigOrDie(kb.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(b.kube.Discovery()))

	objs := append(kustomize(t, deployDir), readManifests(t, filepath.Join(deployDir, "examples", "member-secret.yaml"))...)

	const ns, suffix = "e2e-deploy", "-e2e-deploy"
	kinds := map[string]int{}
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	for _, obj := range objs {
		kinds[obj.GetKind()]++
		relocate(obj, ns, suffix)
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		require.NoError(t, err, "%s %s", gvk, obj.GetName())
		var api dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			require.NotEmpty(t, obj.GetNamespace(), "%s %s names no namespace", obj.GetKind(), obj.GetName())
			api = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		opts := metav1.ApplyOptions{FieldManager: "mci-e2e-deploy", Force: true}
		if obj.GetKind() == "APIService" {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = api.Apply(ctx, obj.GetName(), obj, opts)
		require.NoError(t, err, "applying %s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
		if len(opts.DryRun) == 0 && obj.GetKind() != "Namespace" {
			name := obj.GetName()
			cleanups = append(cleanups, func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
		if obj.GetKind() == "Namespace" {
			cleanups = append(cleanups, func() {
				_ = b.kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
			})
		}
	}
	t.Logf("applied %v", kinds)
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "PodDisruptionBudget", "Service", "APIService", "Secret"} {
		assert.NotZero(t, kinds[kind], "the manifests have no %s", kind)
	}

	// What makes it a production deployment, as the API stored it.
	d, err := b.kube.AppsV1().Deployments(ns).Get(ctx, "mci-apiserver", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int32(2), *d.Spec.Replicas)
	requireHardenedPodSpec(t, d)
	pdb, err := b.kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "mci-apiserver", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, d.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels, "the PodDisruptionBudget covers the Deployment's pods")
	svc, err := b.kube.CoreV1().Services(ns).Get(ctx, "mci-apiserver", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, d.Spec.Selector.MatchLabels, svc.Spec.Selector, "the Service selects the Deployment's pods")

	// In its own cluster the deployed ServiceAccount reads the HTTPRoutes
	// and ReferenceGrants behind import parents, cluster-wide, and may not
	// write them.
	sa := "system:serviceaccount:" + ns + ":mci-apiserver"
	for _, resource := range []string{"httproutes", "referencegrants", "gateways"} {
		for verb, want := range map[string]bool{"list": true, "watch": true, "get": true, "create": false, "update": false, "patch": false, "delete": false} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               sa,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "gateway.networking.k8s.io", Resource: resource, Verb: verb},
			}}
			got, err := b.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Equal(t, want, got.Status.Allowed, "%s %s %s", sa, verb, resource)
		}
	}

	// The example member Secret is one mci-apiserver would accept.
	secret, err := b.kube.CoreV1().Secrets(ns).Get(ctx, "member-cluster-b", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "cluster-b", secret.Labels[clusterset.MemberClusterLabel])
	_, err = clientcmd.RESTConfigFromKubeConfig(secret.Data[clusterset.MemberKubeconfigKey])
	assert.NoError(t, err, "the example's kubeconfig parses")

	// The one write mci makes, and nothing more: the Exported status of
	// pools and the Lease that elects its writer, in its own namespace.
	user := "system:serviceaccount:" + ns + ":mci-apiserver"
	for _, tc := range []struct {
		attrs authorizationv1.ResourceAttributes
		want  bool
	}{
		{authorizationv1.ResourceAttributes{Group: "inference.networking.k8s.io", Resource: "inferencepools", Subresource: "status", Verb: "patch", Namespace: "any"}, true},
		{authorizationv1.ResourceAttributes{Group: "inference.networking.k8s.io", Resource: "inferencepools", Verb: "get", Namespace: "any"}, true},
		{authorizationv1.ResourceAttributes{Group: "inference.networking.k8s.io", Resource: "inferencepools", Verb: "patch", Namespace: "any"}, false},
		{authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: ns, Name: "mci-apiserver-exported-status"}, true},
		{authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "create", Namespace: ns}, true},
		{authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: "kube-system"}, false},
	} {
		attrs := tc.attrs
		review, err := b.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts"}, ResourceAttributes: &attrs},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Equal(t, tc.want, review.Status.Allowed, "%s %s/%s in %s", attrs.Verb, attrs.Resource, attrs.Subresource, attrs.Namespace)
	}
}

func requireHardenedPodSpec(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	assert.NotNil(t, pod.Affinity.PodAntiAffinity, "replicas spread over nodes")
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.Equal(t, "/livez", c.LivenessProbe.HTTPGet.Path)
	assert.False(t, c.Resources.Requests.Cpu().IsZero())
	assert.False(t, c.Resources.Requests.Memory().IsZero())
	assert.False(t, c.Resources.Limits.Memory().IsZero())
}

// relocate moves an object of the manifests from mci-system to ns and
// suffixes cluster-scoped names (and the references to them).
func relocate(obj *unstructured.Unstructured, ns, suffix string) {
	const from = "mci-system"
	clusterScoped := map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true}
	switch {
	case obj.GetKind() == "Namespace" && obj.GetName() == from:
		obj.SetName(ns)
	case clusterScoped[obj.GetKind()]:
		obj.SetName(obj.GetName() + suffix)
	case obj.GetNamespace() == from:
		obj.SetNamespace(ns)
	case obj.GetNamespace() == "kube-system":
		obj.SetName(obj.GetName() + suffix)
	}
	if kind, _, _ := unstructured.NestedString(obj.Object, "roleRef", "kind"); kind == "ClusterRole" {
		name, _, _ := unstructured.NestedString(obj.Object, "roleRef", "name")
		if strings.HasPrefix(name, "mci-") {
			_ = unstructured.SetNestedField(obj.Object, name+suffix, "roleRef", "name")
		}
	}
	if subjects, ok, _ := unstructured.NestedSlice(obj.Object, "subjects"); ok {
		for _, s := range subjects {
			if m, ok := s.(map[string]any); ok && m["namespace"] == from {
				m["namespace"] = ns
			}
		}
		_ = unstructured.SetNestedSlice(obj.Object, subjects, "subjects")
	}
	if obj.GetKind() == "APIService" {
		_ = unstructured.SetNestedField(obj.Object, ns, "spec", "service", "namespace")
	}
}

// hack/create-member-secret.sh against the local ClusterSet's kubeconfigs:
// cluster-c becomes a member Secret in cluster-b, authenticated by a token
// of a ServiceAccount of cluster-c that the script mints, never by the
// credentials of the context it is given, and never on a command line.
func TestSecurityCreateMemberSecretScript(t *testing.T) {
	realKubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is required for this test")
	}
	ctx := t.Context()
	b, c := clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	kb, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)
	kc, err := clusters.Cluster("cluster-c")
	require.NoError(t, err)
	// Not mci-system: the running mci-apiserver must not pick these up.
	const ns = "e2e-member-script"
	b.createNamespace(t, ctx, ns)
	// Every kubectl the script starts goes through this one, which writes
	// down its command line: the token must never be on one.
	bin := t.TempDir()
	argv := filepath.Join(bin, "argv.log")
	require.NoError(t, os.WriteFile(filepath.Join(bin, "kubectl"),
		[]byte("#!/bin/sh\nprintf '%s\\n' \"$*\" >>"+argv+"\nexec "+realKubectl+" \"$@\"\n"), 0o700))
	run := func(kubeconfig string, args ...string) (string, string, error) {
		t.Helper()
		args = append([]string{"--kubeconfig", kubeconfig, "--context", "cluster-c", "--namespace", ns, "--target-kubeconfig", kb.Kubeconfig}, args...)
		cmd := exec.CommandContext(ctx, "../../hack/create-member-secret.sh", args...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	script := func(args ...string) (string, string) {
		t.Helper()
		out, stderr, err := run(kc.Kubeconfig, args...)
		require.NoError(t, err, "create-member-secret.sh %s: %s", strings.Join(args, " "), stderr)
		return out, stderr
	}
	// connect checks what the Secret's kubeconfig is: self-contained, one
	// context, and who it authenticates as in cluster-c.
	connect := func(t *testing.T, secret *corev1.Secret) (string, kubernetes.Interface, string) {
		t.Helper()
		assert.Equal(t, "cluster-c", secret.Labels[clusterset.MemberClusterLabel])
		data := secret.Data[clusterset.MemberKubeconfigKey]
		cfg, err := clientcmd.Load(data)
		require.NoError(t, err)
		assert.Len(t, cfg.Contexts, 1, "one context")
		for _, cl := range cfg.Clusters {
			assert.Empty(t, cl.CertificateAuthority, "no file references")
			assert.NotEmpty(t, cl.CertificateAuthorityData)
			assert.False(t, cl.InsecureSkipTLSVerify)
		}
		require.Len(t, cfg.AuthInfos, 1)
		for _, u := range cfg.AuthInfos {
			assert.Nil(t, u.Exec, "no plugin")
			assert.Nil(t, u.AuthProvider, "no plugin")
			assert.Empty(t, u.TokenFile+u.ClientCertificate+u.ClientKey, "no file references")
			assert.Empty(t, u.ClientCertificateData, "a token, not the context's certificate")
		}
		rc, err := clientcmd.RESTConfigFromKubeConfig(data)
		require.NoError(t, err)
		kube := kubernetes.NewForConfigOrDie(rc)
		review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return review.Status.UserInfo.Username, kube, rc.BearerToken
	}
	neverOnACommandLine := func(t *testing.T, token string) {
		t.Helper()
		require.NotEmpty(t, token)
		lines, err := os.ReadFile(argv)
		require.NoError(t, err)
		assert.Contains(t, string(lines), "create token", "the wrapper saw the script's kubectl commands")
		assert.NotContains(t, string(lines), token, "the token was on a command line")
	}

	t.Run("by default, a week's token of the member's mci-member-reader, in a dry run", func(t *testing.T) {
		memberReaderToken(t, ctx, c, "mci-member-reader", t) // the ServiceAccount the deployments create
		out, stderr := script("--dry-run")
		var secret corev1.Secret
		require.NoError(t, utilyaml.Unmarshal([]byte(out), &secret))
		assert.Equal(t, "member-cluster-c", secret.Name)
		user, _, token := connect(t, &secret)
		assert.Equal(t, "system:serviceaccount:"+localclusterset.MCIAPIServerNamespace+":mci-member-reader", user, "not the context's own credentials")
		neverOnACommandLine(t, token)
		assert.Contains(t, stderr, "expires at")
		var claims struct {
			IssuedAt  int64 `json:"iat"`
			ExpiresAt int64 `json:"exp"`
		}
		parts := strings.Split(token, ".")
		require.Len(t, parts, 3, "a JWT")
		payload, err := base64.RawURLEncoding.DecodeString(parts[1])
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(payload, &claims))
		assert.Equal(t, int64((168 * time.Hour).Seconds()), claims.ExpiresAt-claims.IssuedAt, "a week by default")
		_, err = b.kube.CoreV1().Secrets(ns).Get(ctx, secret.Name, metav1.GetOptions{})
		assert.True(t, err != nil, "a dry run creates nothing")
	})

	t.Run("with another ServiceAccount's token, applied to the target cluster", func(t *testing.T) {
		memberReaderToken(t, ctx, c, "e2e-script-reader", t) // creates the ServiceAccount and its binding
		script("--token-for-service-account", localclusterset.MCIAPIServerNamespace+"/e2e-script-reader", "--token-duration", "1h")
		secret, err := b.kube.CoreV1().Secrets(ns).Get(ctx, "member-cluster-c", metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotContains(t, secret.Annotations, corev1.LastAppliedConfigAnnotation, "the kubeconfig must not be copied into an annotation")
		user, kube, token := connect(t, secret)
		assert.Equal(t, "system:serviceaccount:"+localclusterset.MCIAPIServerNamespace+":e2e-script-reader", user)
		neverOnACommandLine(t, token)
		_, err = kube.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{Limit: 1})
		assert.NoError(t, err, "the member reader may list services")
		_, err = kube.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{Limit: 1})
		assert.Error(t, err, "the member reader may not list secrets")
	})

	t.Run("--reader-cluster mints the token of the reader's own ServiceAccount, which names it as a member", func(t *testing.T) {
		memberReaderToken(t, ctx, c, inferencepoolexportsummary.MemberServiceAccountPrefix+"cluster-b", t) // what the chart's memberReader.readers creates
		out, _ := script("--reader-cluster", "cluster-b", "--dry-run")
		var secret corev1.Secret
		require.NoError(t, utilyaml.Unmarshal([]byte(out), &secret))
		user, _, token := connect(t, &secret)
		assert.Equal(t, "system:serviceaccount:"+localclusterset.MCIAPIServerNamespace+":mci-member-reader.cluster-b", user)
		member, ok := inferencepoolexportsummary.ReaderMember(&apiuser.DefaultInfo{Name: user})
		assert.True(t, ok)
		assert.Equal(t, "cluster-b", member, "cluster-c's summary stream knows the reader as cluster-b")
		neverOnACommandLine(t, token)

		_, stderr, err := run(kc.Kubeconfig, "--reader-cluster", "cluster-b", "--token-for-service-account", "mci-system/other", "--dry-run")
		require.Error(t, err)
		assert.Contains(t, stderr, "leave out --token-for-service-account")
	})

	t.Run("a context that skips TLS verification is refused", func(t *testing.T) {
		cfg, err := clientcmd.LoadFromFile(kc.Kubeconfig)
		require.NoError(t, err)
		for _, cl := range cfg.Clusters {
			cl.InsecureSkipTLSVerify, cl.CertificateAuthorityData, cl.CertificateAuthority = true, nil, ""
		}
		insecure := filepath.Join(t.TempDir(), "insecure.kubeconfig")
		require.NoError(t, clientcmd.WriteToFile(*cfg, insecure))
		_, stderr, err := run(insecure, "--dry-run")
		require.Error(t, err)
		assert.Contains(t, stderr, "skips TLS verification")
	})
}
