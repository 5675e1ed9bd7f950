package apiconflict

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/mci-dev/mci/test/localclusterset"
)

var gv = schema.GroupVersion{Group: "inference.networking.x-k8s.io", Version: "v1alpha1"}

var served = []string{"inferencepoolexports", "inferencepoolimports"}

// importCRD is a CRD of InferencePoolImport in mci's group version, as the
// Gateway API Inference Extension (v1.1 and later) ships it: the same group,
// version, names and short name; its schema does not matter here.
func importCRD(servedVersion bool) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]interface{}{"name": "inferencepoolimports.inference.networking.x-k8s.io"},
		"spec": map[string]interface{}{
			"group": "inference.networking.x-k8s.io",
			"scope": "Namespaced",
			"names": map[string]interface{}{"kind": "InferencePoolImport", "listKind": "InferencePoolImportList", "plural": "inferencepoolimports", "singular": "inferencepoolimport", "shortNames": []interface{}{"infpimp"}},
			"versions": []interface{}{map[string]interface{}{
				"name": "v1alpha1", "served": servedVersion, "storage": true,
				"schema": map[string]interface{}{"openAPIV3Schema": map[string]interface{}{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}},
		},
	}}
}

// mciAPIService is the APIService as mci's manifests register it.
func mciAPIService() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]interface{}{"name": "v1alpha1.inference.networking.x-k8s.io"},
		"spec": map[string]interface{}{
			"group": "inference.networking.x-k8s.io", "version": "v1alpha1",
			"service":              map[string]interface{}{"namespace": "mci-system", "name": "mci-apiserver", "port": int64(443)},
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"insecureSkipTLSVerify": true,
		},
	}}
}

func TestServesVersion(t *testing.T) {
	tests := []struct {
		name string
		crd  *unstructured.Unstructured
		want bool
	}{
		{name: "a CRD serving the group version claims it", crd: importCRD(true), want: true},
		{name: "a CRD whose version is not served claims nothing", crd: importCRD(false), want: false},
		{name: "a CRD of another group claims nothing", crd: func() *unstructured.Unstructured {
			c := importCRD(true)
			_ = unstructured.SetNestedField(c.Object, "other.example.com", "spec", "group")
			return c
		}(), want: false},
		{name: "a CRD with malformed versions claims nothing", crd: func() *unstructured.Unstructured {
			c := importCRD(true)
			_ = unstructured.SetNestedField(c.Object, "v1alpha1", "spec", "versions")
			return c
		}(), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, servesVersion(tt.crd, gv))
		})
	}
}

// Against a real kube-apiserver: what Check sees, and what the aggregator
// does, when mci's APIService and the upstream InferencePoolImport CRD
// meet in one cluster, in either order.
func TestCheckSeesWhoServesTheGroupVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"conflict"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	client := dynamic.NewForConfigOrDie(cs.Clusters[0].Config)
	crds := client.Resource(crdGVR)
	apiServices := client.Resource(apiServiceGVR)

	f, err := Check(ctx, client, gv, served)
	require.NoError(t, err)
	assert.Equal(t, Finding{ServedBy: ServedByNobody}, f, "an empty cluster")

	name := "v1alpha1.inference.networking.x-k8s.io"
	// settled waits until Check has said the same thing for 3 s: the
	// aggregator's CRD registration acts on its own time.
	settled := func(what string) Finding {
		t.Helper()
		var last Finding
		var since time.Time
		require.Eventually(t, func() bool {
			f, err := Check(ctx, client, gv, served)
			if err != nil {
				return false
			}
			if !assert.ObjectsAreEqual(f, last) {
				last, since = f, time.Now()
				return false
			}
			return time.Since(since) > 3*time.Second
		}, time.Minute, 200*time.Millisecond, what)
		t.Logf("%s: %s", what, last.Describe(gv))
		return last
	}
	conflict := []string{"inferencepoolimports.inference.networking.x-k8s.io"}

	// mci installed first, then someone installs the CRD: the APIService
	// that names mci's Service is not kube-apiserver's to manage, and mci
	// keeps answering.
	_, err = apiServices.Create(ctx, mciAPIService(), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = crds.Create(ctx, importCRD(true), metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, Finding{CRDs: conflict, ServedBy: ServedByMCI, Service: "mci-system/mci-apiserver"}, settled("mci's APIService, then the CRD"))

	// mci uninstalled while the CRD stays: kube-apiserver registers the
	// group version for the CRD.
	require.NoError(t, apiServices.Delete(ctx, name, metav1.DeleteOptions{}))
	assert.Equal(t, Finding{CRDs: conflict, ServedBy: ServedLocally}, settled("the CRD after mci's APIService is deleted"))

	// mci installed over the CRD, as `kubectl apply` or Helm would (the
	// labels kube-apiserver put on its APIService stay): kube-apiserver
	// takes the APIService back, and clients see the CRD.
	existing, err := apiServices.Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	desired := mciAPIService()
	desired.SetResourceVersion(existing.GetResourceVersion())
	desired.SetLabels(existing.GetLabels())
	_, err = apiServices.Update(ctx, desired, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Equal(t, Finding{CRDs: conflict, ServedBy: ServedLocally}, settled("mci's APIService applied over the CRD's"))

	// The way from the CRD to mci: delete the CRD, then apply mci's
	// APIService.
	require.NoError(t, crds.Delete(ctx, conflict[0], metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, err := crds.Get(ctx, conflict[0], metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond)
	existing, err = apiServices.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		desired = mciAPIService()
		desired.SetResourceVersion(existing.GetResourceVersion())
		desired.SetLabels(existing.GetLabels())
		_, err = apiServices.Update(ctx, desired, metav1.UpdateOptions{})
	} else if apierrors.IsNotFound(err) {
		_, err = apiServices.Create(ctx, mciAPIService(), metav1.CreateOptions{})
	}
	require.NoError(t, err)
	assert.Equal(t, Finding{ServedBy: ServedByMCI, Service: "mci-system/mci-apiserver"}, settled("mci's APIService once the CRD is deleted"))
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
