package sidecar

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// restartableEPP is an EPP on two fixed loopback ports (ext_proc and gRPC
// health, as upstream EPPs and mci-epp serve them) that can go down and
// come back on the same ports, as a restarted EPP pod behind a stable
// Service address does.
type restartableEPP struct {
	t                       *testing.T
	epp                     *fakeEPP
	extProcAddr, healthAddr string
	extProc, health         *grpc.Server
}

func startRestartableEPP(t *testing.T) *restartableEPP {
	r := &restartableEPP{t: t, epp: &fakeEPP{name: "epp-a", dest: "10.1.0.1:8000"}}
	r.start("127.0.0.1:0", "127.0.0.1:0")
	t.Cleanup(r.stop)
	return r
}

func (r *restartableEPP) start(extProcAddr, healthAddr string) {
	r.t.Helper()
	lis, err := net.Listen("tcp", extProcAddr)
	require.NoError(r.t, err)
	hlis, err := net.Listen("tcp", healthAddr)
	require.NoError(r.t, err)
	r.extProcAddr, r.healthAddr = lis.Addr().String(), hlis.Addr().String()
	r.extProc, r.health = grpc.NewServer(), grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(r.extProc, r.epp)
	hs := health.NewServer()
	hs.SetServingStatus(eppprobe.HealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(r.health, hs)
	go func() { _ = r.extProc.Serve(lis) }()
	go func() { _ = r.health.Serve(hlis) }()
}

func (r *restartableEPP) stop() {
	r.extProc.Stop()
	r.health.Stop()
}

func (r *restartableEPP) restart() { r.start(r.extProcAddr, r.healthAddr) }

// TestRecoveryAfterAnOutageLongerThanTheMaxBackoff holds an EPP down for ten
// times the sidecar's maximum reconnect delay, scaled down from the minutes
// of a real outage, and measures how long after its return the first
// request is served by it. gRPC's default backoff would by then wait
// seconds before the next attempt (1 s growing by 1.6), and the health
// prober's interval another 5 s: the bound holds only because relay and
// prober share the short DialPolicy, a connection that turns READY is
// probed at once, and SERVING makes the relay retry at once.
func TestRecoveryAfterAnOutageLongerThanTheMaxBackoff(t *testing.T) {
	dial := epptransport.DialPolicy{BaseDelay: 20 * time.Millisecond, MaxDelay: 300 * time.Millisecond, MinConnectTimeout: time.Second}
	const (
		outage        = 3 * time.Second
		probeInterval = 5 * time.Second
		bound         = 1500 * time.Millisecond
	)
	tests := []struct {
		name string
		// withHealth: the import lists the EPP's health port, so the
		// prober sees it and HealthBased skips it while it is down.
		withHealth bool
	}{
		{name: "an EPP with a health port, probed and skipped while down", withHealth: true},
		{name: "an EPP without a health port, known only by its failed streams"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startRestartableEPP(t)
			host, port := hostPort(t, e.extProcAddr)
			imp := sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: host, Port: port})
			imp.Annotations = map[string]string{routetable.FailureModeAnnotation: "FailClose"}
			if tt.withHealth {
				_, hp := hostPort(t, e.healthAddr)
				imp.Status.Clusters[0].EndpointPicker.Health.Port = hp
			} else {
				imp.Status.Clusters[0].EndpointPicker.Health = nil
			}
			router := routetable.NewRouter()
			tbl, _ := buildTable(routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), routetable.FailureModeAnnotation, "FailClose")},
				Imports: []*v1alpha1.InferencePoolImport{imp},
			})
			cfg := ServerConfig{AttemptTimeout: time.Second, Dial: dial}
			relay := newRelayer(cfg, nil, nil)
			prober := eppprobe.NewHealthProber(eppprobe.HealthProberOptions{
				Interval:  probeInterval,
				Timeout:   200 * time.Millisecond,
				Dial:      dial,
				OnServing: reconnectProbed(router, relay),
			})
			server, err := newServer(router, liveState{health: prober}, relay, cfg, nil, logr.Discard())
			require.NoError(t, err)
			router.Publish(tbl)
			t.Cleanup(server.Close)
			var targets []string
			for _, c := range tbl.Clusters() {
				targets = append(targets, c.Health)
			}
			prober.SetTargets(targets)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				_ = prober.Run(ctx)
				close(done)
			}()
			t.Cleanup(func() {
				cancel()
				<-done
			})

			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := grpc.NewServer()
			extprocv3.RegisterExternalProcessorServer(srv, server)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			client, err := envoyclient.Dial(lis.Addr().String(), envoyclient.Options{MessageTimeout: 5 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Close() })
			code := func() int {
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				res, err := client.Do(ctx, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
				require.NoError(t, err)
				if res.Immediate != nil {
					return res.Immediate.StatusCode
				}
				return http.StatusOK
			}

			require.Eventually(t, func() bool { return code() == http.StatusOK }, 5*time.Second, 20*time.Millisecond, "the EPP serves before the outage")
			e.stop()
			// Requests keep coming during the outage: each fails the cluster
			// (a failed stream, or a skip while probed NOT_SERVING).
			// (The sleep paces those requests.)
			for deadline := time.Now().Add(outage); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				require.Equal(t, http.StatusServiceUnavailable, code(), "FailClose while the only EPP is down")
			}
			e.restart()
			back := time.Now()
			for code() != http.StatusOK {
				require.Less(t, time.Since(back), 10*time.Second, "the EPP never served again")
				time.Sleep(10 * time.Millisecond) // the resolution of took
			}
			took := time.Since(back)
			t.Logf("first request served %v after the EPP returned from a %v outage (max reconnect delay %v, probe interval %v)", took, outage, dial.MaxDelay, probeInterval)
			assert.Less(t, took, bound)
		})
	}
}
