package sidecar

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// TestServerAnswers503AtItsGlobalLimits holds streams open at an EPP that
// never answers, and checks that a stream beyond --max-streams, or a body
// beyond what is left of --max-inflight-body-bytes, is answered 503 by the
// sidecar at once and counted, and that the budget is whole again once
// the streams end.
func TestServerAnswers503AtItsGlobalLimits(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	h := startServerWith(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: hostOf(t, a), Port: portOf(t, a)})},
	}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}}, ServerConfig{MaxStreams: 2, MaxInflightBodyBytes: 1 << 20})

	// Two streams whose bodies never end, as slow uploads: one of 300 KiB
	// so far (600 KiB of the budget).
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	for _, chunk := range [][]byte{[]byte(`{"model":`), bytes.Repeat([]byte("a"), 300<<10)} {
		s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		require.NoError(t, err)
		require.NoError(t, s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{}}}}))
		require.NoError(t, s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk}}}))
	}
	require.Eventually(t, func() bool { return h.server.admit.bytes.Load() == 600<<10+18 }, 5*time.Second, 5*time.Millisecond)

	res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
	require.NotNil(t, res.Immediate, "a third stream is one too many")
	assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.admission.WithLabelValues(LimitStreams)))

	h.server.admit.maxStreams = 3
	big := append([]byte(`{"model":"chat","prompt":"`), bytes.Repeat([]byte("b"), 300<<10)...)
	res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: append(big, `"}`...)})
	require.NotNil(t, res.Immediate, "a second big body passes the budget")
	assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.admission.WithLabelValues(LimitBodyBytes)))
	assert.Equal(t, 2.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues("", OutcomeOverLimit, "503")))

	res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
	require.Nil(t, res.Immediate, "a small request still fits")
	assert.Equal(t, "10.1.0.1:8000", res.Destination)

	cancel()
	assert.Eventually(t, func() bool { return h.server.admit.bytes.Load() == 0 && h.server.admit.streams.Load() == 0 }, 5*time.Second, 5*time.Millisecond,
		"the budget is whole again once the streams end")
}
