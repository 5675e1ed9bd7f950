package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/test/waitfor"
)

// The upstream InferencePoolImport, as a client built on the Gateway API
// Inference Extension's apix/v1alpha1 types decodes it. Written from the
// published schema (GIE apix/v1alpha1 inferencepoolimport_types.go and the
// ParentStatus/ParentReference of api/v1 inferencepool_types.go): the same
// JSON names, the same required fields. mci serves more than this (the
// seed's status.clusters[], status.conditions, observedGeneration); a client
// of the upstream shape ignores those, so strictness applies to what the
// upstream shape defines: spec and every status.controllers[] entry.
type upstreamImport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is required upstream, and empty.
	Spec   json.RawMessage `json:"spec"`
	Status struct {
		// Controllers is required upstream, at most 8, keyed by name.
		Controllers []json.RawMessage `json:"controllers"`
	} `json:"status"`
}

type upstreamImportController struct {
	Name              string                     `json:"name"`
	ExportingClusters []upstreamExportingCluster `json:"exportingClusters,omitempty"`
	Parents           []upstreamParentStatus     `json:"parents,omitempty"`
	Conditions        []metav1.Condition         `json:"conditions,omitempty"`
}

type upstreamExportingCluster struct {
	Name string `json:"name"`
}

type upstreamParentStatus struct {
	Conditions     []metav1.Condition      `json:"conditions,omitempty"`
	ParentRef      upstreamParentReference `json:"parentRef"`
	ControllerName string                  `json:"controllerName,omitempty"`
}

type upstreamParentReference struct {
	Group     *string `json:"group,omitempty"`
	Kind      string  `json:"kind,omitempty"`
	Name      string  `json:"name"`
	Namespace string  `json:"namespace,omitempty"`
}

// upstreamControllerName is the upstream ControllerName validation: a
// domain, a slash and a path, at most 253 characters.
var upstreamControllerName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$`)

// decodeStrict decodes data into v, refusing fields v does not define.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// checkUpstreamImport checks one served import against the upstream shape
// and its required fields, returning every problem found.
func checkUpstreamImport(raw []byte) (problems []string, controllers []upstreamImportController) {
	var imp upstreamImport
	if err := json.Unmarshal(raw, &imp); err != nil {
		return []string{"decoding: " + err.Error()}, nil
	}
	where := imp.Namespace + "/" + imp.Name
	bad := func(format string, args ...any) { problems = append(problems, where+": "+fmt.Sprintf(format, args...)) }
	if imp.APIVersion != "inference.networking.x-k8s.io/v1alpha1" || imp.Kind != "InferencePoolImport" {
		bad("apiVersion/kind %s/%s", imp.APIVersion, imp.Kind)
	}
	if imp.Name == "" || imp.Namespace == "" {
		bad("metadata.name and metadata.namespace are required")
	}
	var spec struct{}
	if len(imp.Spec) == 0 || decodeStrict(imp.Spec, &spec) != nil {
		bad("spec must be present and empty, got %s", imp.Spec)
	}
	if len(imp.Status.Controllers) == 0 || len(imp.Status.Controllers) > 8 {
		bad("status.controllers is required with 1 to 8 entries, got %d", len(imp.Status.Controllers))
	}
	names := sets.New[string]()
	for i, rc := range imp.Status.Controllers {
		var c upstreamImportController
		if err := decodeStrict(rc, &c); err != nil {
			bad("controllers[%d] is not of the upstream shape: %v", i, err)
			continue
		}
		controllers = append(controllers, c)
		if !upstreamControllerName.MatchString(c.Name) || len(c.Name) > 253 {
			bad("controllers[%d].name %q is not a ControllerName", i, c.Name)
		}
		if names.Has(c.Name) {
			bad("controllers[%d].name %q is not unique", i, c.Name)
		}
		names.Insert(c.Name)
		clusters := sets.New[string]()
		for j, e := range c.ExportingClusters {
			if e.Name == "" || clusters.Has(e.Name) {
				bad("controllers[%d].exportingClusters[%d].name %q must be set and unique", i, j, e.Name)
			}
			clusters.Insert(e.Name)
		}
		checkConditions(bad, fmt.Sprintf("controllers[%d].conditions", i), c.Conditions)
		for j, p := range c.Parents {
			at := fmt.Sprintf("controllers[%d].parents[%d]", i, j)
			if p.ParentRef.Name == "" {
				bad("%s.parentRef.name is required", at)
			}
			if p.ControllerName != "" && !upstreamControllerName.MatchString(p.ControllerName) {
				bad("%s.controllerName %q is not a ControllerName", at, p.ControllerName)
			}
			checkConditions(bad, at+".conditions", p.Conditions)
		}
	}
	return problems, controllers
}

// checkConditions applies metav1.Condition's required fields and the
// upstream list rules (map keyed by type, at most 8).
func checkConditions(bad func(string, ...any), at string, conds []metav1.Condition) {
	if len(conds) > 8 {
		bad("%s has %d entries, at most 8", at, len(conds))
	}
	types := sets.New[string]()
	for k, c := range conds {
		if c.Type == "" || types.Has(c.Type) {
			bad("%s[%d].type %q must be set and unique", at, k, c.Type)
		}
		types.Insert(c.Type)
		if c.Status != metav1.ConditionTrue && c.Status != metav1.ConditionFalse && c.Status != metav1.ConditionUnknown {
			bad("%s[%d].status %q", at, k, c.Status)
		}
		if c.Reason == "" || c.LastTransitionTime.IsZero() {
			bad("%s[%d] (%s) needs a reason and a lastTransitionTime", at, k, c.Type)
		}
	}
}

// Served imports, read through the aggregator as any client reads them,
// decode into the upstream apix/v1alpha1 shape with every required field
// filled: an import with parents, one without, and one of a pool exported
// by two clusters.
func TestServedImportsDecodeIntoTheUpstreamInferencePoolImportShape(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-upstream-shape"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	a.exportReadyPool(t, ctx, ns, "routed", "127.0.0.34")
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "unrouted", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	c.createEPPService(t, ctx, ns, "127.0.0.35")
	_, err = c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "routed", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	b.createProgrammedGateway(t, ctx, ns, "inf-gw", "127.0.0.36")
	_, err = b.gateway.GatewayV1().HTTPRoutes(ns).Create(ctx, importRoute(ns, "routed", "routed", "inf-gw"), metav1.CreateOptions{})
	require.NoError(t, err)

	// Raw JSON from the kube-apiserver of cluster-b (through the
	// aggregator), not mci's own client types.
	var items []json.RawMessage
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		body, err := b.kube.Discovery().RESTClient().Get().
			AbsPath("/apis/inference.networking.x-k8s.io/v1alpha1/namespaces/" + ns + "/inferencepoolimports").DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &list); err != nil {
			return false, err.Error()
		}
		items = list.Items
		if len(items) != 2 {
			return false, fmt.Sprintf("%d imports", len(items))
		}
		var routed upstreamImport
		_ = json.Unmarshal(items[0], &routed)
		var c0 upstreamImportController
		if len(routed.Status.Controllers) == 1 && json.Unmarshal(routed.Status.Controllers[0], &c0) == nil &&
			len(c0.Parents) == 1 && len(c0.ExportingClusters) == 2 {
			return true, ""
		}
		return false, string(items[0])
	})

	// A list's items carry no apiVersion and kind; a GET of each does.
	for i, item := range items {
		var meta upstreamImport
		require.NoError(t, json.Unmarshal(item, &meta))
		raw, err := b.kube.Discovery().RESTClient().Get().
			AbsPath("/apis/inference.networking.x-k8s.io/v1alpha1/namespaces/" + ns + "/inferencepoolimports/" + meta.Name).DoRaw(ctx)
		require.NoError(t, err)
		items[i] = raw
		problems, controllers := checkUpstreamImport(raw)
		assert.Empty(t, problems)
		require.Len(t, controllers, 1)
		assert.Equal(t, v1alpha1.ControllerName, controllers[0].Name)
		assert.Equal(t, "True", condState(controllers[0].Conditions, "Accepted"), string(raw))
	}

	var routed upstreamImport
	require.NoError(t, json.Unmarshal(items[0], &routed))
	require.Equal(t, "routed", routed.Name)
	var ctrl upstreamImportController
	require.NoError(t, decodeStrict(routed.Status.Controllers[0], &ctrl))
	assert.Equal(t, []upstreamExportingCluster{{Name: "cluster-a"}, {Name: "cluster-c"}}, ctrl.ExportingClusters)
	require.Len(t, ctrl.Parents, 1)
	p := ctrl.Parents[0]
	assert.Equal(t, upstreamParentReference{Group: ptrTo("gateway.networking.k8s.io"), Kind: "Gateway", Name: "inf-gw", Namespace: ns}, p.ParentRef)
	assert.Equal(t, "True", condState(p.Conditions, "Accepted"))
	assert.Equal(t, "True", condState(p.Conditions, "ResolvedRefs"))

	var unrouted upstreamImport
	require.NoError(t, json.Unmarshal(items[1], &unrouted))
	require.Equal(t, "unrouted", unrouted.Name)
	var unroutedCtrl upstreamImportController
	require.NoError(t, decodeStrict(unrouted.Status.Controllers[0], &unroutedCtrl))
	assert.Empty(t, unroutedCtrl.Parents, "no route uses it")
	assert.Equal(t, []upstreamExportingCluster{{Name: "cluster-a"}}, unroutedCtrl.ExportingClusters)
}

// The checker itself refuses what upstream clients would choke on: each
// case breaks one rule of the schema.
func TestUpstreamShapeCheckerRefusesBrokenImports(t *testing.T) {
	good := `{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"InferencePoolImport","metadata":{"name":"p","namespace":"n"},"spec":{},` +
		`"status":{"controllers":[{"name":"mci.x-k8s.io/apiserver","exportingClusters":[{"name":"a"}],` +
		`"parents":[{"parentRef":{"name":"gw"},"conditions":[{"type":"Accepted","status":"True","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}]}]}}`
	problems, _ := checkUpstreamImport([]byte(good))
	require.Empty(t, problems)
	for _, tc := range []struct{ name, old, new string }{
		{"no controllers", `"controllers":[{`, `"controllers":[],"x":[{`},
		{"a field upstream does not define", `"exportingClusters":[{"name":"a"}],`, `"exportingClusters":[{"name":"a"}],"routingMode":"x",`},
		{"a controller name without a path", `"name":"mci.x-k8s.io/apiserver"`, `"name":"mci"`},
		{"a parent without a name", `"parentRef":{"name":"gw"}`, `"parentRef":{"name":""}`},
		{"a condition without a reason", `"reason":"Accepted"`, `"reason":""`},
		{"no spec", `"spec":{},`, ``},
		{"an exporting cluster twice", `"exportingClusters":[{"name":"a"}]`, `"exportingClusters":[{"name":"a"},{"name":"a"}]`},
		{"a condition status that is not True, False or Unknown", `"status":"True"`, `"status":"Maybe"`},
	} {
		doc := strings.Replace(good, tc.old, tc.new, 1)
		require.NotEqual(t, good, doc, tc.name)
		problems, _ := checkUpstreamImport([]byte(doc))
		assert.NotEmpty(t, problems, tc.name)
	}
}

func ptrTo(s string) *string { return &s }
