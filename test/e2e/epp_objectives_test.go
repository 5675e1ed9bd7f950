package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// TestEPPHonoursInferenceObjectivesAndModelRewritesOfBothGroups runs the
// real mci-epp in Kubernetes mode against cluster-a with the successors of
// InferenceModel created in the cluster, in both their groups
// (inference.networking.x-k8s.io/v1alpha2 up to GIE v1.5, llm-d.ai/v1alpha2
// since): the objective a request names decides whether it is shed under
// saturation, and a rewrite changes the model the model server is asked
// for. Loopback block 127.0.78.x.
func TestEPPHonoursInferenceObjectivesAndModelRewritesOfBothGroups(t *testing.T) {
	p := newEPPPool(t, "e2e-epp-objectives", 78, []string{"pod-1", "pod-2"}, "lora-x", "lora-y")
	ctx := t.Context()
	x, llmd := p.cluster.mci.InferenceV1alpha2(), p.cluster.mci.LLMDV1alpha2()
	pool := v1alpha2.PoolObjectReference{Name: p.name}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: p.ns} }

	_, err := x.InferenceObjectives(p.ns).Create(ctx, &v1alpha2.InferenceObjective{
		ObjectMeta: meta("background"), Spec: v1alpha2.InferenceObjectiveSpec{Priority: ptr.To[int32](-1), PoolRef: pool},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = llmd.InferenceObjectives(p.ns).Create(ctx, &llmdv1alpha2.InferenceObjective{
		ObjectMeta: meta("batch"), Spec: v1alpha2.InferenceObjectiveSpec{Priority: ptr.To[int32](-10), PoolRef: pool},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = llmd.InferenceObjectives(p.ns).Create(ctx, &llmdv1alpha2.InferenceObjective{
		ObjectMeta: meta("interactive"), Spec: v1alpha2.InferenceObjectiveSpec{Priority: ptr.To[int32](5), PoolRef: pool},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	exact := func(model string, targets ...string) v1alpha2.InferenceModelRewriteRule {
		r := v1alpha2.InferenceModelRewriteRule{Matches: []v1alpha2.Match{{Model: &v1alpha2.ModelMatch{Value: model}}}}
		for _, target := range targets {
			r.Targets = append(r.Targets, v1alpha2.ModelRewriteTarget{ModelRewrite: target})
		}
		return r
	}
	_, err = x.InferenceModelRewrites(p.ns).Create(ctx, &v1alpha2.InferenceModelRewrite{
		ObjectMeta: meta("assistant"),
		Spec:       v1alpha2.InferenceModelRewriteSpec{PoolRef: &pool, Rules: []v1alpha2.InferenceModelRewriteRule{exact("assistant", "lora-x")}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = llmd.InferenceModelRewrites(p.ns).Create(ctx, &llmdv1alpha2.InferenceModelRewrite{
		ObjectMeta: meta("food-review"),
		Spec:       v1alpha2.InferenceModelRewriteSpec{PoolRef: &pool, Rules: []v1alpha2.InferenceModelRewriteRule{exact("food-review", "lora-y")}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	// Every pod saturated: no capacity for a sheddable request.
	for _, m := range p.servers {
		m.pin(t, 100, 0.95)
	}
	e := p.startEPP()
	p.waitForPoolMetrics([]int{100, 100}, []float64{0.95, 0.95})

	withHeader := func(name, value string) envoyclient.Request {
		h := http.Header{}
		h.Set(name, value)
		return envoyclient.Request{Path: "/v1/completions", Body: completion(baseModel), Headers: h}
	}
	t.Run("a request naming an objective of priority below 0 is shed under saturation, in either group", func(t *testing.T) {
		for _, objective := range []string{"background", "batch"} {
			res := e.do(t, withHeader(requestmodel.ObjectiveHeader, objective))
			require.NotNil(t, res.Immediate, "%s: destination %q", objective, res.Destination)
			assert.Equal(t, http.StatusTooManyRequests, res.Immediate.StatusCode, "%s: body %s", objective, res.Immediate.Body)
		}
	})
	t.Run("a request naming an objective of priority above 0, or none, is served", func(t *testing.T) {
		for _, req := range []envoyclient.Request{withHeader(requestmodel.LLMDObjectiveHeader, "interactive"), {Path: "/v1/completions", Body: completion(baseModel)}} {
			res := e.do(t, req)
			require.Nil(t, res.Immediate, "headers %v: immediate response %+v", req.Headers, res.Immediate)
			assert.Contains(t, []string{p.servers[0].address(), p.servers[1].address()}, res.Destination)
		}
	})
	t.Run("an unknown objective is served with the default priority and counted", func(t *testing.T) {
		res := e.do(t, withHeader(requestmodel.ObjectiveHeader, "no-such-objective"))
		require.Nil(t, res.Immediate, "immediate response %+v", res.Immediate)
		m, err := e.metric(ctx, "mci_epp_unknown_objective_requests_total")
		require.NoError(t, err)
		assert.Equal(t, 1.0, m[""])
	})
	t.Run("the EPP reports every model configuration resource as served", func(t *testing.T) {
		m, err := e.metric(ctx, "mci_epp_model_config_api_served")
		require.NoError(t, err)
		assert.Len(t, m, 5, "%v", m)
		for labels, v := range m {
			assert.Equal(t, 1.0, v, labels)
		}
	})
	t.Run("a deleted objective no longer sheds: its name is unknown, priority 0", func(t *testing.T) {
		require.NoError(t, x.InferenceObjectives(p.ns).Delete(ctx, "background", metav1.DeleteOptions{}))
		waitfor.Eventually(t, ctx, watchEvent, func(ctx context.Context) (bool, string) {
			res := e.do(t, withHeader(requestmodel.ObjectiveHeader, "background"))
			return res.Immediate == nil, fmt.Sprintf("immediate response %+v", res.Immediate)
		})
	})

	gateway := httptest.NewServer(envoyclient.NewProxy(e.client, nil))
	t.Cleanup(gateway.Close)
	for _, tc := range []struct {
		name, model, served string
	}{
		{"an inference.networking.x-k8s.io rewrite changes the model the model server is asked for", "assistant", "lora-x"},
		{"an llm-d.ai rewrite changes the model the model server is asked for", "food-review", "lora-y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+"/v1/completions", strings.NewReader(string(completion(tc.model))))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			resp, err := noProxyClient.Do(req)
			require.NoError(t, err)
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
			assert.NotEmpty(t, resp.Header.Get(simulator.InstanceHeader), "a simulator answered")
			got, err := decodeResponse(body)
			require.NoError(t, err)
			assert.Equal(t, tc.served, got.Model, "the model the simulator was asked for")
		})
	}
}

// metric reads the samples of one metric from the EPP's /metrics, keyed by
// their labels as printed ("" for none).
func (e *eppProcess) metric(ctx context.Context, name string) (map[string]float64, error) {
	m, err := e.metrics(ctx)
	if err != nil {
		return nil, err
	}
	got := map[string]float64{}
	for _, s := range m.Samples(name) {
		labels := ""
		if len(s.Labels) > 0 {
			labels = fmt.Sprint(s.Labels)
		}
		got[labels] = s.Value
	}
	return got, nil
}
