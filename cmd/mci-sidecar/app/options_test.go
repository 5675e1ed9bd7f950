package app

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/outlier"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar"
)

func TestOptions(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token"), 0o600))
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("mci-sidecar", nil, nil)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(t.TempDir(), "tls.crt"), filepath.Join(t.TempDir(), "tls.key")
	require.NoError(t, os.WriteFile(certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, keyPEM, 0o600))
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, cfg sidecar.Config)
	}{
		{
			name: "the defaults are the EPP ports and HealthBased",
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, 9002, cfg.GRPCPort)
				assert.Equal(t, 9003, cfg.HealthPort)
				assert.Equal(t, 9090, cfg.MetricsPort)
				assert.Equal(t, routingpolicy.HealthBased, cfg.Watch.DefaultPolicy.Name)
				assert.True(t, cfg.Watch.InferenceModels)
				assert.Equal(t, sidecar.DefaultAttemptTimeout, cfg.Server.AttemptTimeout)
				assert.Equal(t, sidecar.ResponsePhaseRelay, cfg.Server.ResponsePhase, "EPPs see the response phase by default")
			},
		},
		{
			name: "flags reach the configuration",
			args: []string{"--local-cluster-name=cluster-b", "--default-cluster-policy=LocalFirst", "--gateway=example/inf-gw",
				"--gateway=other/gw", "--endpoint-picker-service=example/mci-sidecar", "--grpc-port=19002", "--bind-address=127.0.0.1", "--epp-attempt-timeout=500ms", "--drain-timeout=3s", "--epp-response-phase=Skip"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, "cluster-b", cfg.Watch.LocalCluster)
				assert.Equal(t, routingpolicy.LocalFirst, cfg.Watch.DefaultPolicy.Name)
				assert.Equal(t, []types.NamespacedName{{Namespace: "example", Name: "inf-gw"}, {Namespace: "other", Name: "gw"}}, cfg.Watch.Gateways)
				assert.Equal(t, []types.NamespacedName{{Namespace: "example", Name: "mci-sidecar"}}, cfg.Watch.EndpointPickerServices)
				assert.Equal(t, 19002, cfg.GRPCPort)
				assert.Equal(t, "127.0.0.1", cfg.BindAddress)
				assert.Equal(t, 500*time.Millisecond, cfg.Server.AttemptTimeout)
				assert.Equal(t, 3*time.Second, cfg.DrainTimeout)
				assert.Equal(t, sidecar.ResponsePhaseSkip, cfg.Server.ResponsePhase)
			},
		},
		{
			name: "Secret namespaces reach the configuration",
			args: []string{"--endpoint-picker-secret-namespaces=example,team-b", "--endpoint-picker-secret-namespaces=team-c"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, []string{"example", "team-b", "team-c"}, cfg.SecretNamespaces)
			},
		},
		{
			name: "no credential of the sidecar leaves it by default, not even a mounted ServiceAccount token",
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Empty(t, cfg.MetricsTokenFile)
				assert.Empty(t, cfg.MetricsTokenRecipients)
			},
		},
		{
			name: "a token file and its recipients reach the configuration",
			args: []string{"--epp-metrics-token-file=" + tokenFile, "--epp-metrics-token-recipients=cluster-b,cluster-c/example/llm"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, tokenFile, cfg.MetricsTokenFile)
				assert.Equal(t, []string{"cluster-b", "cluster-c/example/llm"}, cfg.MetricsTokenRecipients)
			},
		},
		{name: "token recipients without a token file are refused", args: []string{"--epp-metrics-token-recipients=cluster-b"}, wantErr: "--epp-metrics-token-recipients needs --epp-metrics-token-file"},
		{name: "a token recipient that is neither a cluster nor a pool is refused", args: []string{"--epp-metrics-token-file=" + tokenFile, "--epp-metrics-token-recipients=example/llm"}, wantErr: `metrics token recipient "example/llm": want a cluster name or cluster/namespace/name`},
		{name: "an empty token file flag sends no token", args: []string{"--epp-metrics-token-file="}, check: func(t *testing.T, cfg sidecar.Config) { assert.Empty(t, cfg.MetricsTokenFile) }},
		{name: "a token file that does not exist is refused", args: []string{"--epp-metrics-token-file=/nonexistent/token"}, wantErr: "--epp-metrics-token-file: stat /nonexistent/token"},
		{
			name: "the EPP transport and reconnect delay reach the configuration",
			args: []string{"--endpoint-picker-transport=ext-proc=TLS", "--epp-reconnect-max-delay=500ms"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, eppaddr.TransportModes{ExtProc: "TLS"}, cfg.Watch.DefaultTransport)
				assert.Equal(t, 500*time.Millisecond, cfg.Server.Dial.MaxDelay)
			},
		},
		{name: "an EPP transport that does not parse is refused", args: []string{"--endpoint-picker-transport=ext-proc=tls"}, wantErr: `--endpoint-picker-transport: port ext-proc: transport mode "tls"`},
		{name: "a Secret namespace that is not a namespace name is refused", args: []string{"--endpoint-picker-secret-namespaces=Example/x"}, wantErr: `--endpoint-picker-secret-namespaces "Example/x" is not a namespace name`},
		{name: "a serving certificate without its key is refused", args: []string{"--tls-cert-file=/etc/mci/tls.crt"}, wantErr: "--tls-cert-file needs --tls-private-key-file"},
		{name: "an unknown policy is refused", args: []string{"--default-cluster-policy=Fastest"}, wantErr: `unknown configuration "Fastest"`},
		{name: "a gateway without a namespace is refused", args: []string{"--gateway=inf-gw"}, wantErr: "want namespace/name"},
		{name: "an endpoint picker Service without a namespace is refused", args: []string{"--endpoint-picker-service=mci-sidecar"}, wantErr: "--endpoint-picker-service \"mci-sidecar\": want namespace/name"},
		{name: "a port out of range is refused", args: []string{"--metrics-port=70000"}, wantErr: "is not a port"},
		{
			name: "scoring flags reach the configuration",
			args: []string{"--default-cluster-policy=prefix-cache=3, in-flight=1,pick=two-choices", "--session-header=X-Session-ID", "--session-cookie=sid",
				"--session-ttl=1m", "--max-sessions=10", "--prefix-index-blocks=1024", "--explain-decisions"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, "prefix-cache=3, in-flight=1,pick=two-choices", cfg.Watch.DefaultPolicy.Name)
				assert.Equal(t, clusterscore.SessionSpec{Header: "x-session-id", Cookie: "sid"}, cfg.Server.Session)
				assert.Equal(t, clusterscore.MemoryOptions{PrefixBlocks: 1024, Sessions: 10, SessionTTL: time.Minute, EWMAAlpha: clusterscore.DefaultEWMAAlpha}, cfg.Server.Memory)
				assert.True(t, cfg.Server.ExplainDecisions)
			},
		},
		{
			name: "sessions and explanations are off by default",
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, clusterscore.SessionSpec{}, cfg.Server.Session)
				assert.False(t, cfg.Server.ExplainDecisions)
			},
		},
		{name: "an invalid inline policy is refused", args: []string{"--default-cluster-policy=prefix-cache=0"}, wantErr: "--default-cluster-policy: "},
		{name: "an invalid session header is refused", args: []string{"--session-header=x session"}, wantErr: `--session-header "x session"`},
		{name: "an unknown response phase is refused", args: []string{"--epp-response-phase=Answer"}, wantErr: `--epp-response-phase: unknown response phase "Answer"`},
		{
			name:  "the ext_proc transport is auto by default, and reaches the configuration",
			check: func(t *testing.T, cfg sidecar.Config) { assert.Equal(t, extproc.ListenerAuto, cfg.ExtProcTransport) },
		},
		{
			name: "an ext_proc transport asked for reaches the configuration",
			args: []string{"--ext-proc-tls=self-signed"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, extproc.ListenerSelfSigned, cfg.ExtProcTransport)
			},
		},
		{
			name: "ext_proc listens on loopback by default, health and metrics on every address",
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, "0.0.0.0", cfg.BindAddress)
				assert.Equal(t, "127.0.0.1", cfg.ExtProcBindAddress)
			},
		},
		{name: "ext_proc listens on IPv6 loopback when every IPv6 address is asked", args: []string{"--bind-address=::"},
			check: func(t *testing.T, cfg sidecar.Config) { assert.Equal(t, "::1", cfg.ExtProcBindAddress) }},
		{name: "ext_proc listens on every address in shim mode, where gateways reach it through its Service", args: []string{"--endpoint-picker-service=example/mci-sidecar"},
			check: func(t *testing.T, cfg sidecar.Config) { assert.Equal(t, "0.0.0.0", cfg.ExtProcBindAddress) }},
		{name: "ext_proc listens on the one address --bind-address names", args: []string{"--bind-address=127.0.3.1"},
			check: func(t *testing.T, cfg sidecar.Config) { assert.Equal(t, "127.0.3.1", cfg.ExtProcBindAddress) }},
		{name: "ext_proc listens where --ext-proc-bind-address says", args: []string{"--ext-proc-bind-address=0.0.0.0"},
			check: func(t *testing.T, cfg sidecar.Config) { assert.Equal(t, "0.0.0.0", cfg.ExtProcBindAddress) }},
		{
			name: "other clusters' EPPs are reached over verified TLS only by default",
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, routetable.RemoteEndpointPickers{RequireVerified: true}, cfg.Watch.RemoteEndpointPickers)
			},
		},
		{
			name: "imports allowed to reach their EPPs without verified TLS reach the configuration",
			args: []string{"--insecure-remote-endpoint-pickers=example/llm,*"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, routetable.RemoteEndpointPickers{RequireVerified: true, Insecure: []string{"example/llm", "*"}}, cfg.Watch.RemoteEndpointPickers)
			},
		},
		{name: "an insecure import that is not namespace/name is refused", args: []string{"--insecure-remote-endpoint-pickers=llm"}, wantErr: `--insecure-remote-endpoint-pickers "llm": want namespace/name`},
		{name: "an ext_proc bind address that is not an IP is refused", args: []string{"--ext-proc-bind-address=localhost"}, wantErr: `--ext-proc-bind-address "localhost" is not an IP address`},
		{name: "an unknown ext_proc transport is refused", args: []string{"--ext-proc-tls=tls"}, wantErr: `--ext-proc-tls "tls": want one of auto, self-signed-or-plaintext, self-signed, plaintext`},
		{name: "an ext_proc transport with a serving certificate is refused", args: []string{"--ext-proc-tls=plaintext", "--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile}, wantErr: "--ext-proc-tls plaintext conflicts with --tls-cert-file"},
		{name: "a zero timeout is refused", args: []string{"--epp-attempt-timeout=0s"}, wantErr: "must be positive"},
		{
			name: "remote EPPs get none of the gateway's metadata by default",
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Empty(t, cfg.Server.ForwardedMetadataNamespaces)
			},
		},
		{
			name: "metadata namespaces forwarded to remote EPPs reach the configuration",
			args: []string{"--remote-epp-forwarded-metadata-namespaces=example.tenant,envoy.lb"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, []string{"example.tenant", "envoy.lb"}, cfg.Server.ForwardedMetadataNamespaces)
			},
		},
		{
			name: "each flag's ranges reach their place in the remote destinations' policy",
			args: []string{"--service-cluster-ip-range=10.96.0.0/12,fd00:10:96::/112", "--cluster-cidr=10.244.0.1/16", "--denied-destination-cidrs=192.168.0.0/24"},
			check: func(t *testing.T, cfg sidecar.Config) {
				assert.Equal(t, eppanswer.Policy{
					ServiceRanges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/112")},
					PodRanges:     []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
					Denied:        []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24")},
				}, cfg.Server.RemoteDestinations)
			},
		},
		{
			name: "outlier detection is on by default, with the defaults that meet the error-sink targets",
			check: func(t *testing.T, cfg sidecar.Config) {
				require.NotNil(t, cfg.Server.Outlier)
				assert.Equal(t, outlier.DefaultConfig(), cfg.Server.Outlier.Detection)
				assert.Equal(t, outlier.DefaultFirstByteConfig(), cfg.Server.Outlier.FirstByte)
			},
		},
		{
			name: "outlier flags reach the configuration",
			args: []string{"--outlier-consecutive-5xx=7", "--outlier-base-ejection-time=10s", "--outlier-max-ejection-time=1m", "--outlier-max-ejection-percent=34", "--outlier-first-byte-floor=2s", "--outlier-first-byte-ceiling=0"},
			check: func(t *testing.T, cfg sidecar.Config) {
				o := cfg.Server.Outlier
				require.NotNil(t, o)
				assert.Equal(t, 7, o.Detection.Consecutive5xx)
				assert.Equal(t, 10*time.Second, o.Detection.BaseEjectionTime)
				assert.Equal(t, time.Minute, o.Detection.MaxEjectionTime)
				assert.Equal(t, 34, o.Detection.MaxEjectionPercent)
				assert.Equal(t, 2*time.Second, o.FirstByte.Floor)
				assert.Zero(t, o.FirstByte.Ceiling, "no first-byte bound")
			},
		},
		{
			name:  "outlier detection turned off",
			args:  []string{"--outlier-detection=false"},
			check: func(t *testing.T, cfg sidecar.Config) { assert.Nil(t, cfg.Server.Outlier) },
		},
		{name: "a maximum ejection time below the base is refused", args: []string{"--outlier-base-ejection-time=30s"}, wantErr: "--outlier-*: base ejection time 30s must be positive and at most the maximum 20s"},
		{name: "a first-byte ceiling below the floor is refused", args: []string{"--outlier-first-byte-ceiling=500ms"}, wantErr: "--outlier-first-byte-*: first-byte floor 1s must be positive and at most the ceiling 500ms"},
		{name: "a range that does not parse is refused, naming its flag", args: []string{"--cluster-cidr=10.244.0.0"}, wantErr: `--cluster-cidr: netip.ParsePrefix("10.244.0.0"): no '/'`},
		{name: "forwarding the subset hint to remote EPPs is refused", args: []string{"--remote-epp-forwarded-metadata-namespaces=envoy.lb.subset_hint"}, wantErr: "names envoy.lb.subset_hint, which lists this cluster's endpoints"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			cmd := NewCommand(o)
			require.NoError(t, cmd.Flags().Parse(tt.args))
			err := o.Validate()
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			cfg, err := o.Config()
			require.NoError(t, err)
			tt.check(t, cfg)
		})
	}
}

func TestMetricsAreBehindAuthenticationByDefault(t *testing.T) {
	o := NewOptions()
	require.NoError(t, NewCommand(o).Flags().Parse(nil))
	assert.True(t, o.MetricsEndpointAuth)
	filter, err := o.metricsFilter(kubefake.NewSimpleClientset(), klog.Background())
	require.NoError(t, err)
	require.NotNil(t, filter, "/metrics is guarded")
	rec := httptest.NewRecorder()
	filter(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("served without a token") })).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	assert.Equal(t, http.StatusUnauthorized, rec.Code, "no token, no metrics")

	require.NoError(t, NewCommand(o).Flags().Parse([]string{"--metrics-endpoint-auth=false"}))
	filter, err = o.metricsFilter(kubefake.NewSimpleClientset(), klog.Background())
	require.NoError(t, err)
	assert.Nil(t, filter, "turned off on purpose")
}
