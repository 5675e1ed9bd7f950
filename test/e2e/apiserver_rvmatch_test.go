package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/registry/virtual"
	"github.com/mci-dev/mci/test/waitfor"
)

// LIST through the aggregator follows the Kubernetes API conventions for
// resourceVersion and resourceVersionMatch.
func TestAPIServerListHonoursResourceVersionMatch(t *testing.T) {
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-rvmatch"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)
	names := func(l *v1alpha1.InferencePoolImportList) []string {
		out := []string{}
		for _, i := range l.Items {
			out = append(out, i.Name)
		}
		return out
	}
	listWith := func(n int) string {
		var rv string
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			l, err := imports.List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != n {
				return false, "waiting for imports"
			}
			rv = l.ResourceVersion
			return true, ""
		})
		return rv
	}

	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "one", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	rv1 := listWith(1)
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "two", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	rv2 := listWith(2)

	t.Run("Exact serves the state at that version", func(t *testing.T) {
		// With several replicas behind the APIService, another replica
		// cannot serve this one's exact state (410); a retry may reach the
		// replica that issued it.
		var l *v1alpha1.InferencePoolImportList
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			l, err = imports.List(ctx, metav1.ListOptions{ResourceVersion: rv1, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
			if err != nil && !(apierrors.IsResourceExpired(err) && strings.Contains(err.Error(), "another replica")) {
				require.NoError(t, err)
			}
			return err == nil, "waiting for the replica that issued the version"
		})
		assert.Equal(t, []string{"one"}, names(l))
		assert.Equal(t, rv1, l.ResourceVersion)
	})

	t.Run("NotOlderThan, resourceVersion 0 and none serve the current state", func(t *testing.T) {
		for _, opts := range []metav1.ListOptions{
			{ResourceVersion: rv1, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			{ResourceVersion: rv1},
			{ResourceVersion: "0"},
			{ResourceVersion: "0", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			{},
		} {
			l, err := imports.List(ctx, opts)
			require.NoError(t, err, "%+v", opts)
			assert.Equal(t, []string{"one", "two"}, names(l), "%+v", opts)
			v, err := virtual.ParseVersion(l.ResourceVersion)
			require.NoError(t, err)
			v2, err := virtual.ParseVersion(rv2)
			require.NoError(t, err)
			assert.True(t, v.Covers(v2), "%+v answered with a version older than one already served", opts)
		}
	})

	t.Run("NotOlderThan a version the server never reaches is 504 too large", func(t *testing.T) {
		v, err := virtual.ParseVersion(rv2)
		require.NoError(t, err)
		v["cluster-a"] += 1 << 40
		start := time.Now()
		// One request: client-go would retry it ten times, as the answer
		// carries Retry-After (so does upstream's).
		err = b.mci.InferenceV1alpha1().RESTClient().Get().Namespace(ns).Resource("inferencepoolimports").
			Param("resourceVersion", v.String()).Param("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan)).
			MaxRetries(0).Do(ctx).Error()
		require.Error(t, err)
		assert.True(t, apierrors.IsTimeout(err) && apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge), "%v", err)
		assert.Less(t, time.Since(start), 10*time.Second, "the server waits briefly, not forever")
	})

	t.Run("Exact at a version from another run of the server is 410 Gone", func(t *testing.T) {
		v, err := virtual.ParseVersion(rv1)
		require.NoError(t, err)
		v["~epoch"]++
		_, err = imports.List(ctx, metav1.ListOptions{ResourceVersion: v.String(), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
		assert.True(t, apierrors.IsResourceExpired(err), "%v", err)
	})

	t.Run("invalid combinations are refused as the API machinery does", func(t *testing.T) {
		for _, opts := range []metav1.ListOptions{
			{ResourceVersionMatch: metav1.ResourceVersionMatchExact},
			{ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			{ResourceVersion: "0", ResourceVersionMatch: metav1.ResourceVersionMatchExact},
			{ResourceVersion: rv1, ResourceVersionMatch: "Newest"},
		} {
			_, err := imports.List(ctx, opts)
			assert.True(t, apierrors.IsInvalid(err), "%+v: %v", opts, err)
		}
		_, err := imports.List(ctx, metav1.ListOptions{ResourceVersion: "12345", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
		assert.True(t, apierrors.IsBadRequest(err), "a version this server never issued: %v", err)
	})
}
