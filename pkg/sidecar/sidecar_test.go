package sidecar

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	mcifake "github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// modelServer stands for a vLLM pod on 127.0.0.1: idle metrics, and an
// inference endpoint that says who served the request.
func modelServer(t testing.TB, name string) *httptest.Server {
	srv := httptest.NewServer(modelHandler(name))
	t.Cleanup(srv.Close)
	return srv
}

// modelHandler is what modelServer serves.
func modelHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n")
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_ = json.NewEncoder(w).Encode(map[string]string{"served_by": name, "host": r.Host, "path": r.URL.Path})
	})
}

// runEPP runs a pkg/epp Endpoint Picker on 127.0.0.1 in front of one model
// server, serving tls (plaintext when empty); stop takes it down.
func runEPP(t testing.TB, model *httptest.Server, tls extproc.TLSOptions) (e *epp.EPP, stop func()) {
	e, err := epp.New(epp.Config{
		BindAddress: "127.0.0.1", PoolName: "llm", ScrapeInterval: 50 * time.Millisecond,
		TLS:    tls,
		Picker: epp.PickerConfig{Scheduling: scheduling.DefaultConfig()},
	}, epp.StaticSource{Endpoints: []epp.Endpoint{{Name: "pod", Address: model.Listener.Addr().String()}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = e.Run(ctx)
		close(done)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return e, stop
}

// eppImported is the import entry of a cluster whose EPP is e.
func eppImported(t testing.TB, name string, e *epp.EPP) func(*v1alpha1.InferencePoolImport) {
	return func(imp *v1alpha1.InferencePoolImport) {
		host, port := hostPort(t, e.GRPCAddr())
		_, hp := hostPort(t, e.HealthAddr())
		_, mp := hostPort(t, e.MetricsAddr())
		entry := sidecartest.Import("x", sidecartest.Imported{Name: name, Addr: host, Port: port}).Status.Clusters[0]
		entry.EndpointPicker.Health.Port = hp
		entry.EndpointPicker.Metrics.Port = mp
		imp.Status.Clusters = append(imp.Status.Clusters, entry)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSidecarDataPath runs the whole data path on loopback: an Envoy-like
// gateway (test/envoyclient.Proxy) asks the sidecar, which relays to one of two
// clusters' real EPPs (pkg/epp), whose model server answers. Taking one
// EPP down moves the traffic to the other cluster with no failed request.
func TestSidecarDataPath(t *testing.T) {
	msA, msC := modelServer(t, "model-a"), modelServer(t, "model-c")
	eppA, stopA := runEPP(t, msA, extproc.TLSOptions{})
	eppC, _ := runEPP(t, msC, extproc.TLSOptions{})

	path := startTwoClusters(t, msA, msC, eppA, eppC, routingpolicy.HealthBased)
	s, gw := path.sidecar, path.gateway
	// Once the prober has seen both EPPs, the split is even.
	require.Eventually(t, func() bool {
		_, body := get(t, "http://"+s.MetricsAddr()+"/metrics")
		return strings.Count(body, "mci_sidecar_epp_healthy{") == 2 && !strings.Contains(body, "mci_sidecar_epp_healthy{cluster=\"cluster-a\",pool=\"example/llm\"} 0")
	}, 10*time.Second, 20*time.Millisecond)

	send := func() (int, map[string]string) {
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/completions", strings.NewReader(`{"model":"base","prompt":"hi"}`))
		require.NoError(t, err)
		req.Host = "my.model.com"
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		var out map[string]string
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &out)
		if out == nil {
			out = map[string]string{"body": string(b)}
		}
		return resp.StatusCode, out
	}

	served := map[string]int{}
	for range 40 {
		code, out := send()
		require.Equal(t, http.StatusOK, code, out)
		served[out["served_by"]]++
		assert.Equal(t, "my.model.com", out["host"])
		assert.Equal(t, "/v1/completions", out["path"])
	}
	assert.Equal(t, map[string]int{"model-a": 20, "model-c": 20}, served, "two healthy clusters of equal weight share equally")

	// cluster-a's EPP goes down: every request still succeeds, on cluster-c.
	stopA()
	served = map[string]int{}
	for range 40 {
		code, out := send()
		require.Equal(t, http.StatusOK, code, out)
		served[out["served_by"]]++
	}
	assert.Equal(t, map[string]int{"model-c": 40}, served)

	_, body := get(t, "http://"+s.MetricsAddr()+"/metrics")
	assert.Contains(t, body, `mci_sidecar_requests_total{cluster="cluster-c",code="200",outcome="routed"}`)
	assert.Contains(t, body, "mci_sidecar_routing_table_generation")
	assert.Contains(t, body, "mci_sidecar_pick_duration_seconds_bucket")
	assert.Contains(t, body, `mci_sidecar_epp_healthy{cluster="cluster-a",pool="example/llm"} 0`)

	// SIGTERM: the sidecar drains and stops.
	require.NoError(t, path.stop())
	assert.False(t, path.serving())
}

// with is cfg changed by each of configure in turn.
func (cfg Config) with(configure ...func(*Config)) Config {
	for _, f := range configure {
		f(&cfg)
	}
	return cfg
}

// twoClusters is the loopback data path the sidecar's end-to-end tests
// share: import llm of cluster-a and cluster-c, each a real EPP in front
// of its model server; llm-route of Gateway inf-gw (host my.model.com,
// prefix /v1) to it; a sidecar of cluster-b, serving; and an Envoy-like
// gateway in front of it.
type twoClusters struct {
	sidecar *Sidecar
	mci     *mcifake.Clientset
	gateway *httptest.Server
	// serving says whether the sidecar's health check answers SERVING.
	serving func() bool
	// stop is SIGTERM: the sidecar drains and stops; Run's error. The
	// test's end stops it too if the test did not.
	stop func() error
}

func startTwoClusters(t *testing.T, msA, msC *httptest.Server, eppA, eppC *epp.EPP, policy string, configure ...func(*Config)) *twoClusters {
	t.Helper()
	imp := sidecartest.Import("llm")
	eppImported(t, "cluster-a", eppA)(imp)
	eppImported(t, "cluster-c", eppC)(imp)
	// The pools' published ports: their model servers'.
	_, imp.Status.Clusters[0].TargetPortNumber = hostPort(t, msA.Listener.Addr().String())
	_, imp.Status.Clusters[1].TargetPortNumber = hostPort(t, msC.Listener.Addr().String())
	r := sidecartest.Route("llm-route", 0, []string{"my.model.com"}, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/v1")}, sidecartest.ImportRef("llm", nil)))
	r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw"}}

	path := &twoClusters{mci: mcifake.NewSimpleClientset(imp)}
	s, err := New(Config{
		BindAddress:    "127.0.0.1",
		Watch:          WatchConfig{LocalCluster: "cluster-b", DefaultPolicy: routingpolicy.Named()[policy], Gateways: gatewayRefs("example/inf-gw")},
		Server:         ServerConfig{AttemptTimeout: time.Second, Scheduling: scheduling.DefaultConfig(), RemoteDestinations: eppanswer.Policy{AllowLoopback: true}},
		HealthInterval: 50 * time.Millisecond,
		DrainTimeout:   2 * time.Second,
	}.with(configure...), Clients{
		Kube:    kubefake.NewSimpleClientset(),
		MCI:     path.mci,
		Gateway: sidecartest.GatewayClients(r, sidecartest.Gateway("inf-gw", sidecartest.Listener("http", 80, "", nil))),
	})
	require.NoError(t, err)
	path.sidecar = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	var stopErr error
	path.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(10 * time.Second):
				stopErr = fmt.Errorf("the sidecar did not stop")
			}
		})
		return stopErr
	}
	t.Cleanup(func() { _ = path.stop() })

	// Ready once the table is built.
	hc, err := grpc.NewClient(s.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = hc.Close() })
	path.serving = func() bool {
		resp, err := healthpb.NewHealthClient(hc).Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}
	require.Eventually(t, path.serving, 10*time.Second, 10*time.Millisecond)

	client, err := envoyclient.Dial(s.GRPCAddr(), envoyclient.Options{MessageTimeout: 5 * time.Second})
	require.NoError(t, err)
	path.gateway = httptest.NewServer(envoyclient.NewProxy(client, nil))
	t.Cleanup(func() {
		path.gateway.Close()
		_ = client.Close()
	})
	return path
}

// TestSidecarExtProcTransport: what the ext_proc port serves by default
// and when asked: in shim mode TLS with a self-signed certificate, which
// gateways reach without verifying it as they reach upstream EPPs, and
// plaintext for those that speak it; otherwise plaintext, as before.
func TestSidecarExtProcTransport(t *testing.T) {
	skipVerify := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // as gateways reach EPPs
	tests := []struct {
		name          string
		transport     extproc.ListenerTransport
		shim          bool
		wantServed    string
		tls, plaintxt bool
	}{
		{name: "shim mode by default: self-signed TLS and plaintext", shim: true, wantServed: "self-signed-or-plaintext", tls: true, plaintxt: true},
		{name: "not a shim by default: plaintext", wantServed: "plaintext", plaintxt: true},
		{name: "self-signed only", transport: extproc.ListenerSelfSigned, shim: true, wantServed: "self-signed", tls: true},
		{name: "plaintext asked for in shim mode", transport: extproc.ListenerPlaintext, shim: true, wantServed: "plaintext", plaintxt: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{BindAddress: "127.0.0.1", ExtProcTransport: tt.transport, DrainTimeout: time.Second}
			if tt.shim {
				cfg.Watch.EndpointPickerServices = []types.NamespacedName{sidecarService}
			}
			s, err := New(cfg, Clients{Kube: kubefake.NewSimpleClientset(), MCI: mcifake.NewSimpleClientset(), Gateway: sidecartest.GatewayClients()})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			defer func() {
				cancel()
				<-done
			}()
			check := func(creds credentials.TransportCredentials) bool {
				cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(creds))
				require.NoError(t, err)
				defer func() { _ = cc.Close() }()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
				return err == nil
			}
			assert.Equal(t, tt.tls, check(skipVerify), "TLS without verification")
			assert.Equal(t, tt.plaintxt, check(insecure.NewCredentials()), "plaintext")
			_, body := get(t, "http://"+s.MetricsAddr()+"/metrics")
			assert.Contains(t, body, `mci_sidecar_ext_proc_transport{transport="`+tt.wantServed+`"} 1`)
		})
	}
}
