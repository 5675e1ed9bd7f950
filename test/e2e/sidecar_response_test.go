package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/waitfor"
)

// eppSeries sums the series of an mci-epp's /metrics whose name is metric
// and whose labels include every one of labels (`code="503"`).
func (e *clusterEPP) eppSeries(ctx context.Context, metric string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := promtext.Get(ctx, "http://"+net.JoinHostPort(e.ip, strconv.Itoa(eppMetricsPort))+"/metrics")
	if err != nil {
		return 0, err
	}
	selector := metric
	if len(labels) > 0 {
		selector += "{" + strings.Join(labels, ",") + "}"
	}
	return m.SumMatching(selector)
}

// heldResponse is a request through the sidecar whose response is held in
// the middle of its body, as a model server streaming tokens holds it.
type heldResponse struct {
	destination string
	body        *io.PipeWriter
	cancel      context.CancelFunc
	done        chan error
}

// holdResponse runs a completion request through the sidecar's ext_proc
// service as the gateway does, then starts its response phase (headers,
// a first piece of the body) and holds it there until release or cancel.
func holdResponse(t *testing.T, client *envoyclient.Client) *heldResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	x, err := client.Start(ctx, envoyclient.Request{Path: "/v1/completions", Body: completion(baseModel)})
	require.NoError(t, err)
	require.Nil(t, x.Result.Immediate, "%+v", x.Result.Immediate)
	require.NotEmpty(t, x.Result.Destination)
	pr, pw := io.Pipe()
	h := &heldResponse{destination: x.Result.Destination, body: pw, cancel: cancel, done: make(chan error, 1)}
	go func() {
		ir, err := x.Respond(envoyclient.Response{Headers: http.Header{"Content-Type": {"text/event-stream"}}, BodyReader: pr}, discardSink{})
		if err == nil && ir != nil {
			err = fmt.Errorf("immediate response %d in the response phase", ir.StatusCode)
		}
		if err != nil {
			x.Reset()
		} else {
			x.Close()
		}
		h.done <- err
	}()
	_, err = pw.Write([]byte("data: {\"choices\":[{\"text\":\"Hello\"}]}\n\n"))
	require.NoError(t, err)
	return h
}

// release ends the held response's body: the response completes.
func (h *heldResponse) release(t *testing.T) {
	t.Helper()
	_, err := h.body.Write([]byte("data: [DONE]\n\n"))
	require.NoError(t, err)
	require.NoError(t, h.body.Close())
	require.NoError(t, <-h.done)
	h.cancel()
}

// abandon is the client going away in the middle of the response.
func (h *heldResponse) abandon(t *testing.T) {
	t.Helper()
	h.cancel()
	require.Error(t, <-h.done)
	_ = h.body.Close()
}

type discardSink struct{}

func (discardSink) WriteHeaders(int, http.Header) error { return nil }
func (discardSink) WriteBody([]byte) error              { return nil }
func (discardSink) WriteTrailers(http.Header) error     { return nil }

func TestSidecarRelaysTheResponsePhaseToTheRemoteEPPThatServes(t *testing.T) {
	s := newSidecarSetupWith(t, "e2e-sidecar-response", sidecarOptions{blockA: 171, blockC: 173, sidecarIP: "127.0.172.1"})
	ctx := t.Context()
	client, err := envoyclient.Dial(s.sidecar.GRPCAddr(), envoyclient.Options{MessageTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	clusterOf := map[string]string{
		s.servers["cluster-a"].address(): "cluster-a",
		s.servers["cluster-c"].address(): "cluster-c",
	}
	// gauges reads what the test compares of each EPP.
	gauges := func(ctx context.Context, metric string, labels ...string) (map[string]float64, error) {
		got := map[string]float64{}
		for name, e := range s.epps {
			v, err := e.eppSeries(ctx, metric, labels...)
			if err != nil {
				return nil, err
			}
			got[name] = v
		}
		return got, nil
	}
	waitGauges := func(what string, want map[string]float64, metric string, labels ...string) {
		t.Helper()
		start := time.Now()
		waitfor.Eventually(t, ctx, 15*time.Second, func(ctx context.Context) (bool, string) {
			got, err := gauges(ctx, metric, labels...)
			if err != nil {
				return false, err.Error()
			}
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("%s: %v, want %v", metric, got, want)
		})
		t.Logf("%s: %s %v after %s", what, metric, want, time.Since(start).Round(time.Millisecond))
	}
	servedBefore, err := gauges(ctx, "mci_epp_served_reports_total", `result="picked"`)
	require.NoError(t, err)

	t.Run("the remote EPPs count the streams held open in the response phase, until they end", func(t *testing.T) {
		const n = 8
		held := make([]*heldResponse, n)
		want := map[string]float64{"cluster-a": 0, "cluster-c": 0}
		for i := range held {
			held[i] = holdResponse(t, client)
			cluster, ok := clusterOf[held[i].destination]
			require.True(t, ok, "destination %s is a model server of cluster-a or cluster-c", held[i].destination)
			want[cluster]++
		}
		require.Positive(t, want["cluster-a"], "the Weighted route sends streams to both clusters: %v", want)
		require.Positive(t, want["cluster-c"], "the Weighted route sends streams to both clusters: %v", want)
		waitGauges(fmt.Sprintf("%d streams held", n), want, "mci_epp_requests_in_flight")

		// Half complete, the other half are abandoned by their client.
		for i, h := range held {
			if i%2 == 0 {
				h.release(t)
			} else {
				h.abandon(t)
			}
		}
		waitGauges("every stream ended", map[string]float64{"cluster-a": 0, "cluster-c": 0}, "mci_epp_requests_in_flight")

		served, err := gauges(ctx, "mci_epp_served_reports_total", `result="picked"`)
		require.NoError(t, err)
		for name := range want {
			assert.Equal(t, want[name], served[name]-servedBefore[name], "%s got the served report of each of its requests", name)
		}
	})

	t.Run("a failed-over request is in flight only in the EPP of the cluster that serves it", func(t *testing.T) {
		// cluster-a's pool loses its only model server: its EPP answers 503
		// and the sidecar fails over to cluster-c.
		a := clusterClients(t, "cluster-a")
		(&eppPool{t: t, cluster: a, ns: s.ns, name: "llm"}).setReady(s.servers["cluster-a"], false)
		waitGauges("cluster-a's pool emptied", map[string]float64{"cluster-a": 0, "cluster-c": 1}, "inference_pool_ready_pods")
		refusedBefore, err := s.epps["cluster-a"].eppSeries(ctx, "mci_epp_requests_total", `code="503"`)
		require.NoError(t, err)

		const n = 4
		var held []*heldResponse
		for range n {
			h := holdResponse(t, client)
			require.Equal(t, "cluster-c", clusterOf[h.destination], "the request is served by cluster-c")
			held = append(held, h)
		}
		waitGauges(fmt.Sprintf("%d failed-over streams held", n), map[string]float64{"cluster-a": 0, "cluster-c": n}, "mci_epp_requests_in_flight")
		refused, err := s.epps["cluster-a"].eppSeries(ctx, "mci_epp_requests_total", `code="503"`)
		require.NoError(t, err)
		assert.Positive(t, refused-refusedBefore, "cluster-a's EPP was tried first for some of them")
		// The EPP counts a stream closed when its handler returns, after
		// its refusal is sent: the sidecar may be on cluster-c by then.
		waitfor.Eventually(t, ctx, 5*time.Second, func(ctx context.Context) (bool, string) {
			streamsA, err := s.epps["cluster-a"].eppSeries(ctx, "mci_epp_ext_proc_streams")
			return err == nil && streamsA == 0, fmt.Sprintf("cluster-a's EPP has %v streams open (err %v): the failed attempts' streams must be closed", streamsA, err)
		})

		for _, h := range held {
			h.release(t)
		}
		waitGauges("the failed-over streams ended", map[string]float64{"cluster-a": 0, "cluster-c": 0}, "mci_epp_requests_in_flight")
	})

	t.Run("a request through the gateway completes with its response phase relayed", func(t *testing.T) {
		code, instance, body := s.send(t)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, s.instances["cluster-c"], instance)
		waitGauges("after a request through the gateway", map[string]float64{"cluster-a": 0, "cluster-c": 0}, "mci_epp_requests_in_flight")
	})
}
