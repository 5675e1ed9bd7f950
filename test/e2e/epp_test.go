package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// These tests run the real mci-epp binary in Kubernetes mode against
// cluster-a: it follows an InferencePool, its pods (whose status the tests
// write as a kubelet would) and InferenceModels, scrapes simulated vLLM
// model servers listening on the pods' loopback addresses, and is driven
// over ext_proc exactly as Envoy drives it.

// watchEvent bounds how long a change of a pod's readiness may take to
// reach the EPP's choices: one watch event, plus a scrape for a pod that
// comes back.
const watchEvent = 3 * time.Second

// seedPod is one pod of a seed 001 worked example.
type seedPod struct {
	queue    int
	kvCache  float64
	adapters []string
}

func TestEPPPicksThePodOfEachWorkedExampleOfSeed001(t *testing.T) {
	p := newEPPPool(t, "e2e-epp-seed001", 71, []string{"pod-a", "pod-b", "pod-c"}, "lora-x", "lora-y")
	p.createModel("assistant-x", v1alpha2.Critical, "lora-x")
	p.createModel("batch", v1alpha2.Sheddable, baseModel)
	p.createModel("assistant-y", v1alpha2.Critical, "lora-y")
	epp := p.startEPP()
	a, b := p.servers[0], p.servers[1]

	for _, tc := range []struct {
		name  string
		model string
		pods  [3]seedPod // A, B, C
		want  *modelServer
	}{{
		name:  "example 1: a critical request for LoRA-X goes to the low-queue pod that has LoRA-X (A)",
		model: "assistant-x",
		pods:  [3]seedPod{{10, 0.30, []string{"lora-x"}}, {5, 0.70, nil}, {60, 0.20, []string{"lora-x"}}},
		want:  a,
	}, {
		name:  "example 2: a sheddable request goes to the only pod with capacity (B)",
		model: "batch",
		pods:  [3]seedPod{{6, 0.85, nil}, {4, 0.75, nil}, {7, 0.60, nil}},
		want:  b,
	}, {
		name:  "example 3: a critical request for LoRA-Y with high queues everywhere goes to the least-queued pod that has LoRA-Y (A)",
		model: "assistant-y",
		pods:  [3]seedPod{{70, 0.40, []string{"lora-y"}}, {80, 0.60, []string{"lora-y"}}, {65, 0.70, nil}},
		want:  a,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var queues []int
			var kvCaches []float64
			for i, sp := range tc.pods {
				p.servers[i].pin(t, sp.queue, sp.kvCache, sp.adapters...)
				queues, kvCaches = append(queues, sp.queue), append(kvCaches, sp.kvCache)
			}
			p.waitForPoolMetrics(queues, kvCaches)

			got := epp.destinations(t, tc.model, 20)
			assert.Equal(t, map[string]int{tc.want.address(): 20}, got,
				"every request goes to %s (%s)", tc.want.pod, tc.want.address())
		})
	}
}

func TestEPPStopsPickingAPodWithinAWatchEventOfItsReadinessTurningFalse(t *testing.T) {
	p := newEPPPool(t, "e2e-epp-readiness", 72, []string{"pod-1", "pod-2", "pod-3"})
	epp := p.startEPP()
	flipped := p.servers[1]

	// Idle pods tie, so requests spread over all of them at random; all
	// three show up once the EPP has every pod's metrics (a pod not yet
	// scraped never wins against a measured one).
	seesAll := func(ctx context.Context) (bool, string) {
		got := epp.destinations(t, baseModel, 30)
		return len(got) == len(p.servers), fmt.Sprintf("destinations %v", got)
	}
	waitfor.Eventually(t, t.Context(), 15*time.Second, seesAll)

	start := time.Now()
	p.setReady(flipped, false)
	waitfor.Eventually(t, t.Context(), watchEvent, func(ctx context.Context) (bool, string) {
		got := epp.destinations(t, baseModel, 20)
		return got[flipped.address()] == 0, fmt.Sprintf("destinations %v", got)
	})
	t.Logf("%s left the EPP's choices %s after its Ready condition turned False", flipped.pod, time.Since(start).Round(time.Millisecond))

	got := epp.destinations(t, baseModel, 200)
	assert.Zero(t, got[flipped.address()], "a not-ready pod gets no request: %v", got)
	assert.Equal(t, 200, got[p.servers[0].address()]+got[p.servers[2].address()], "the ready pods get every request: %v", got)
	m, err := epp.poolMetrics(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2.0, m["inference_pool_ready_pods"])

	start = time.Now()
	p.setReady(flipped, true)
	waitfor.Eventually(t, t.Context(), watchEvent, func(ctx context.Context) (bool, string) {
		got := epp.destinations(t, baseModel, 30)
		return got[flipped.address()] > 0, fmt.Sprintf("destinations %v", got)
	})
	t.Logf("%s was back in the EPP's choices %s after its Ready condition turned True", flipped.pod, time.Since(start).Round(time.Millisecond))
	waitfor.Eventually(t, t.Context(), 15*time.Second, seesAll)
}

func TestEPPSendsARequestThroughTheGatewayToTheChosenModelServer(t *testing.T) {
	p := newEPPPool(t, "e2e-epp-gateway", 73, []string{"sim-1", "sim-2", "sim-3"}, "lora-x")
	p.createModel("assistant", v1alpha2.Critical, "lora-x")
	// sim-2 has lora-x loaded and the shortest queue and KV cache: it wins
	// for the adapter and for the base model alike.
	p.servers[0].pin(t, 3, 0.20)
	p.servers[1].pin(t, 1, 0.10, "lora-x")
	p.servers[2].pin(t, 20, 0.50)
	epp := p.startEPP()
	p.waitForPoolMetrics([]int{3, 1, 20}, []float64{0.20, 0.10, 0.50})

	gateway := httptest.NewServer(envoyclient.NewProxy(epp.client, nil))
	t.Cleanup(gateway.Close)

	for _, tc := range []struct {
		name, model, servedModel string
	}{
		{"a model with an InferenceModel is rewritten to its target model", "assistant", "lora-x"},
		{"a model without an InferenceModel goes on as it is", baseModel, baseModel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, gateway.URL+"/v1/completions", strings.NewReader(string(completion(tc.model))))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			resp, err := noProxyClient.Do(req)
			require.NoError(t, err)
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)

			assert.Equal(t, "sim-2", resp.Header.Get(simulator.InstanceHeader), "the chosen simulator answered")
			got, err := decodeResponse(body)
			require.NoError(t, err)
			assert.Equal(t, tc.servedModel, got.Model, "the model the simulator was asked for")
			assert.Equal(t, "sim-2", got.Instance)
		})
	}
}

func TestEPPAnswersErrorsOverTheExtProcProtocol(t *testing.T) {
	p := newEPPPool(t, "e2e-epp-errors", 74, []string{"pod-1", "pod-2"})
	p.createModel("batch", v1alpha2.Sheddable, baseModel)
	p.createModel("assistant", v1alpha2.Critical, baseModel)
	for _, m := range p.servers {
		m.pin(t, 100, 0.95)
	}
	epp := p.startEPP()
	p.waitForPoolMetrics([]int{100, 100}, []float64{0.95, 0.95})

	t.Run("a sheddable request gets 429 when every pod is saturated", func(t *testing.T) {
		res := epp.route(t, "batch")
		require.NotNil(t, res.Immediate, "destination %q", res.Destination)
		assert.Equal(t, http.StatusTooManyRequests, res.Immediate.StatusCode, "body: %s", res.Immediate.Body)
	})

	t.Run("a critical request is still served when every pod is saturated", func(t *testing.T) {
		res := epp.route(t, "assistant")
		require.Nil(t, res.Immediate, "immediate response %+v", res.Immediate)
		assert.Contains(t, []string{p.servers[0].address(), p.servers[1].address()}, res.Destination)
	})

	for _, tc := range []struct {
		name string
		body string
	}{
		{"a body that is not JSON gets 400", "this is not JSON"},
		{"a JSON body without a model gets 400", `{"prompt": "Say hello"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := epp.do(t, envoyclient.Request{Path: "/v1/completions", Body: []byte(tc.body)})
			require.NotNil(t, res.Immediate, "destination %q", res.Destination)
			assert.Equal(t, http.StatusBadRequest, res.Immediate.StatusCode, "body: %s", res.Immediate.Body)
		})
	}

	t.Run("any request gets 503 when no pod is ready", func(t *testing.T) {
		for _, m := range p.servers {
			p.setReady(m, false)
		}
		var res *envoyclient.Result
		waitfor.Eventually(t, t.Context(), watchEvent, func(ctx context.Context) (bool, string) {
			res = epp.route(t, "assistant")
			return res.Immediate != nil, fmt.Sprintf("destination %q", res.Destination)
		})
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode, "body: %s", res.Immediate.Body)
		res = epp.route(t, "batch")
		require.NotNil(t, res.Immediate, "destination %q", res.Destination)
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode, "body: %s", res.Immediate.Body)
	})
}
