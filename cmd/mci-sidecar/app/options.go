// Package app holds mci-sidecar's flags and turns them into a running
// sidecar.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/http/httpguts"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/metricsauth"
	"github.com/mci-dev/mci/pkg/noserver"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/servedapis"
	"github.com/mci-dev/mci/pkg/sidecar"
	"github.com/mci-dev/mci/pkg/version"
)

// Options are mci-sidecar's flags.
type Options struct {
	Logs *logs.Options

	Kubeconfig string
	extproc.ServingOptions
	ExtProcTLS         string
	ExtProcBindAddress string
	// MetricsEndpointAuth guards /metrics with the cluster's TokenReview
	// and SubjectAccessReview, as mci-epp's --metrics-endpoint-auth.
	MetricsEndpointAuth bool

	LocalClusterName        string
	LocalClusterRegion      string
	DefaultClusterPolicy    string
	Gateways                []string
	EndpointPickerServices  []string
	InferenceModels         bool
	BackendTLSPolicies      bool
	SecretNamespaces        []string
	EPPMetricsTokenFile     string
	EPPMetricsTokenTargets  []string
	EndpointPickerTransport string
	InsecureRemoteEPPs      []string

	MaxRequestBodyBytes int64
	EPPAttemptTimeout   time.Duration
	EPPDrainTimeout     time.Duration
	EPPReconnectDelay   time.Duration
	EPPResponsePhase    string
	HealthInterval      time.Duration
	HealthTimeout       time.Duration
	ScrapeInterval      time.Duration
	ScrapeTimeout       time.Duration
	// PrefixSummaryInterval paces the asks for the EPPs' prefix summaries
	// (0: never).
	PrefixSummaryInterval time.Duration
	DrainTimeout          time.Duration
	Scheduling            scheduling.Config

	SessionHeader     string
	SessionCookie     string
	SessionTTL        time.Duration
	MaxSessions       int
	PrefixIndexBlocks int
	ExplainDecisions  bool

	ServiceClusterIPRanges     []string
	ClusterCIDRs               []string
	DeniedDestinationCIDRs     []string
	AllowLoopbackDestinations  bool
	RemoteEPPStrippedHeaders   []string
	RemoteEPPForwardedMetadata []string
	MaxStreams                 int64
	MaxInflightBodyBytes       int64

	Outlier OutlierOptions
}

// NewOptions returns the defaults: the ports of the Endpoint Picker
// convention (ext_proc 9002, health 9003, metrics 9090), so the sidecar can
// stand where an EPP stands.
func NewOptions() *Options {
	serving := extproc.NewServingOptions()
	serving.HealthPortUsage = "SERVING once the first routing table is built, NOT_SERVING while draining."
	return &Options{
		Logs:                  logs.NewOptions(),
		ServingOptions:        serving,
		ExtProcTLS:            string(extproc.ListenerAuto),
		MetricsEndpointAuth:   true,
		DefaultClusterPolicy:  routingpolicy.HealthBased,
		InferenceModels:       true,
		BackendTLSPolicies:    true,
		MaxRequestBodyBytes:   sidecar.DefaultMaxRequestBodyBytes,
		EPPAttemptTimeout:     sidecar.DefaultAttemptTimeout,
		EPPDrainTimeout:       sidecar.DefaultEPPDrainTimeout,
		EPPReconnectDelay:     epptransport.DefaultReconnectMaxDelay,
		EPPResponsePhase:      string(sidecar.ResponsePhaseRelay),
		HealthInterval:        eppprobe.DefaultHealthInterval,
		HealthTimeout:         eppprobe.DefaultHealthTimeout,
		ScrapeInterval:        eppprobe.DefaultScrapeInterval,
		ScrapeTimeout:         eppprobe.DefaultScrapeTimeout,
		PrefixSummaryInterval: eppprobe.DefaultPrefixSummaryInterval,
		DrainTimeout:          sidecar.DefaultDrainTimeout,
		Scheduling:            scheduling.DefaultConfig(),
		SessionTTL:            clusterscore.DefaultMemoryOptions().SessionTTL,
		MaxSessions:           clusterscore.DefaultMemoryOptions().Sessions,
		PrefixIndexBlocks:     clusterscore.DefaultMemoryOptions().PrefixBlocks,
		MaxStreams:            sidecar.DefaultMaxStreams,
		MaxInflightBodyBytes:  sidecar.DefaultMaxInflightBodyBytes,
		Outlier:               NewOutlierOptions(),
	}
}

// NewCommand returns the mci-sidecar command.
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mci-sidecar",
		Short: "Multi-cluster ext_proc server for an Inference Gateway",
		Long: `mci-sidecar is the Envoy ext_proc server of an Inference Gateway that makes
InferencePoolImports routable. For each request it matches the HTTPRoute rule,
picks a backendRef by weight (InferencePool and InferencePoolImport mixed),
picks a cluster of an import by policy, and then relays the request to that
cluster's Endpoint Picker (EndpointMode: the gateway receives the remote model
server as destination) or names the remote parent gateway as destination
(ParentMode).

Cluster policy per HTTPRoute (else per InferencePool or InferencePoolImport):
annotation mci.x-k8s.io/cluster-policy, a named configuration of the cluster
scoring pipeline (Weighted, HealthBased, MetricsBased, LocalFirst,
PrefixAffinity, HubReference) or one written inline ("prefix-cache=3,in-flight=1,
pick=two-choices"); cluster weights:
mci.x-k8s.io/cluster-weights ("cluster-a=3,cluster-c=1"), failure mode of
imports: mci.x-k8s.io/failure-mode (FailOpen, FailClose).`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logsapi.ValidateAndApply(o.Logs, nil); err != nil {
				return err
			}
			version.LogStart(klog.FromContext(cmd.Context()), cmd.Name())
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	logsapi.AddFlags(o.Logs, fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig of the local cluster. Default: the in-cluster configuration.")
	o.ServingOptions.AddFlags(fs)
	fs.StringVar(&o.ExtProcTLS, "ext-proc-tls", o.ExtProcTLS, "What the ext_proc ports serve when --tls-cert-file is not set: self-signed-or-plaintext (TLS with a certificate generated at start to clients that open with a TLS handshake, plaintext to the others, on the same port), self-signed (TLS only), plaintext, or auto: self-signed-or-plaintext when --endpoint-picker-service is set (an EPP shim, which gateways reach as they reach upstream EPPs: TLS without verifying the certificate), else plaintext (Envoy's ext_proc server, as artifacts/envoy configures it). With --tls-cert-file, leave it auto: that certificate is served on every port. The gRPC health and metrics ports stay plaintext but with --tls-cert-file.")
	fs.StringVar(&o.ExtProcBindAddress, "ext-proc-bind-address", o.ExtProcBindAddress, "IP address the main ext_proc port (--grpc-port) listens on. Default: 127.0.0.1 (::1 for --bind-address ::) when --bind-address is every address, as Envoy in the sidecar's pod calls it on loopback and nothing else should; --bind-address when it names one address, or in EPP shim mode (--endpoint-picker-service), where gateways reach the sidecar through its Service.")
	fs.BoolVar(&o.MetricsEndpointAuth, "metrics-endpoint-auth", o.MetricsEndpointAuth, "Serve /metrics only to bearer tokens, as mci-epp --metrics-endpoint-auth and upstream EPPs do: the cluster authenticates the token (TokenReview) and authorizes get on the non-resource URL /metrics (SubjectAccessReview); the sidecar's identity needs create on tokenreviews and subjectaccessreviews. Without a token 401, with a token not allowed 403. Set false only where nothing but trusted scrapers reach the metrics port.")
	fs.StringVar(&o.LocalClusterRegion, "local-cluster-region", o.LocalClusterRegion, "Region of this cluster (a DNS label), as its exporters state theirs with "+v1alpha1.ExportSettingsAnnotation+": a route's "+routetable.ClusterRegionsAnnotation+" annotation allows local InferencePools only when it lists this region. Default: none, and then such routes never use local pools.")
	fs.StringVar(&o.LocalClusterName, "local-cluster-name", o.LocalClusterName, "Name of this cluster in the ClusterSet: the cluster of local InferencePools (LocalFirst, metrics labels). Default: "+routetable.DefaultLocalCluster+".")
	fs.StringVar(&o.DefaultClusterPolicy, "default-cluster-policy", o.DefaultClusterPolicy, "Cluster policy where no annotation chooses one: Weighted, HealthBased, MetricsBased, LocalFirst, PrefixAffinity, HubReference, or a configuration of the scoring pipeline written inline as in the annotation (\"prefix-cache=3,session=2,in-flight=1,pick=max-score\"; scorers prefix-cache, session, latency, errors, in-flight, queue, kv-cache, weight; pick max-score, two-choices, round-robin, chain; filters=health+ready+weight+model+saturation+local-first; affinity-margin=<requests per ready pod>|off; queue-margin=<waiting requests per server>|off; home-bound=<times the average load>|off).")
	fs.StringSliceVar(&o.Gateways, "gateway", o.Gateways, "namespace/name of the Gateway this sidecar serves; only the HTTPRoutes its listeners accept are routed (Gateway API's allowedRoutes namespaces and kinds, parentRef sectionName and port, listener hostnames; the sidecar reads that Gateway and the Namespaces' labels). Repeatable. Default: every HTTPRoute, whatever its parentRefs. Cross-namespace backendRefs need a ReferenceGrant either way.")
	fs.StringSliceVar(&o.EndpointPickerServices, "endpoint-picker-service", o.EndpointPickerServices, "namespace/name of a Service of this sidecar that InferencePools name as their endpointPickerRef. Repeatable. Set, the sidecar is an EPP shim: it serves the gateway's EPP-protocol requests for each such pool with the pool's real local EPP (annotation "+routetable.LocalEndpointPickerAnnotation+") and the clusters of the InferencePoolImport of the same namespace/name, instead of routing by HTTPRoute. It also listens on every port such pools' endpointPickerRefs name, and a connection's port tells its pool (several pools can share one Service on different ports); see --ext-proc-tls for what it serves.")
	fs.StringSliceVar(&o.SecretNamespaces, "endpoint-picker-secret-namespaces", o.SecretNamespaces, "Namespaces whose Secrets labelled "+epptransport.CredentialsLabel+"=true the sidecar reads (get, list, watch: grant it a Role in each), for EPPs that serve TLS: an InferencePool's annotation "+v1alpha1.EndpointPickerSecretAnnotation+" names such a Secret of its namespace, and so do the secretRefs of its imports. Keys: "+epptransport.SecretCAKey+" (required), "+epptransport.SecretCertKey+" and "+epptransport.SecretKeyKey+" (a client certificate, for mutual TLS), "+epptransport.SecretServerNameKey+" (the name to verify instead of the address). Repeatable. Default: none, and such EPPs are not reached.")
	fs.StringVar(&o.EPPMetricsTokenFile, "epp-metrics-token-file", o.EPPMetricsTokenFile, "File of the sidecar's own bearer token for the scrapes of EPPs' /metrics (MetricsBased), which upstream EPPs require by default: a projected ServiceAccount token with an audience of its own and a short expiry (never the pod's default token, which the cluster's API accepts), re-read as the kubelet rotates it. It is sent only over verified TLS (the pool's credentials Secret or a BackendTLSPolicy), only to in-cluster EPPs (local pools whose EPP Service is not an ExternalName) and to those --epp-metrics-token-recipients names, and only where the pool names no token Secret of its own; each refusal is logged once per change and shown in mci_sidecar_epp_metrics_token_withheld. Default: none, and no credential of the sidecar leaves it.")
	fs.StringSliceVar(&o.EPPMetricsTokenTargets, "epp-metrics-token-recipients", o.EPPMetricsTokenTargets, "EPPs beyond the in-cluster ones that may get the token of --epp-metrics-token-file (over verified TLS only): a cluster name (every pool's EPP of that cluster; the local cluster's name lets local pools with an ExternalName EPP Service have it) or cluster/namespace/name (one pool's EPP of that cluster), such as clusters that trust this cluster's ServiceAccount token issuer. Repeatable. Default: none.")
	fs.StringVar(&o.EndpointPickerTransport, "endpoint-picker-transport", o.EndpointPickerTransport, "How the ports of EPPs are reached where nothing else says (the pool's annotation "+v1alpha1.EndpointPickerTransportAnnotation+", its credentials Secret, a BackendTLSPolicy of its EPP Service): TLS or Plaintext for every port, or port=mode pairs with ports ext-proc, health and metrics. \"ext-proc=TLS\" suits EPPs with the upstream defaults (Gateway API Inference Extension and llm-d EPPs: ext_proc over TLS with a self-signed certificate, plaintext gRPC health and metrics); a TLS port with nothing to verify it with is not verified, as gateways reach those EPPs. Default: plaintext. Another cluster's EPP whose ext_proc port is not verified TLS is not routed to unless --insecure-remote-endpoint-pickers names its import.")
	fs.StringSliceVar(&o.InsecureRemoteEPPs, "insecure-remote-endpoint-pickers", o.InsecureRemoteEPPs, "InferencePoolImports (namespace/name, or * for all) whose other clusters' EPPs may be reached without verified TLS (plaintext, or TLS not verified). Such an EPP sees the requests it routes, prompts and headers, and names where the gateway sends them, so by default the ext_proc port of another cluster's EPP is reached only over TLS verified with the pool's credentials Secret or a BackendTLSPolicy, and a cluster that would not be is skipped (a routing table problem, logged). This side decides: nothing an exporter writes allows less. Each cluster allowed or refused is shown in mci_sidecar_remote_epp_unverified. Repeatable. Default: none.")
	fs.BoolVar(&o.InferenceModels, "inference-models", o.InferenceModels, "Read InferenceModels and InferenceObjectives (inference.networking.x-k8s.io/v1alpha2 and llm-d.ai/v1alpha2) for the criticality of requests (MetricsBased shedding), where the cluster serves them (its API discovery is asked at start; CRDs installed later are read after a restart): the objective a request names in x-gateway-inference-objective (priority below 0 is sheddable), else its model's InferenceModel. Routing does not wait for them. Without them every request is Standard and never shed. Set false only to force them off where the cluster serves them (every request Standard).")
	fs.BoolVar(&o.BackendTLSPolicies, "backend-tls-policies", o.BackendTLSPolicies, "Read BackendTLSPolicies (gateway.networking.k8s.io/v1) for the TLS of local EPPs, as gateways do: a policy that targets an EPP Service makes its ext-proc port TLS, verified with the policy's CA ConfigMaps (read in --endpoint-picker-secret-namespaces) and hostname. Read where the cluster serves them (its API discovery is asked at start; a CRD installed later is read after a restart). Routing waits for them: set false only to force them off where the cluster serves them but the sidecar may not read them. (Imports carry the exporting cluster's policies without this flag.)")
	fs.Int64Var(&o.MaxRequestBodyBytes, "max-request-body-bytes", o.MaxRequestBodyBytes, "Largest request body buffered; larger requests get 413.")
	fs.DurationVar(&o.EPPAttemptTimeout, "epp-attempt-timeout", o.EPPAttemptTimeout, "Longest wait for one EPP's answer before the next cluster is tried. Keep it below the gateway's ext_proc message timeout.")
	fs.DurationVar(&o.EPPDrainTimeout, "epp-drain-timeout", o.EPPDrainTimeout, "Longest time the requests in flight on an EPP that left the routing table (an export withdrawn, a cluster gone, new credentials) keep their stream to it; past it the sidecar answers the rest of their response phase itself.")
	fs.DurationVar(&o.EPPReconnectDelay, "epp-reconnect-max-delay", o.EPPReconnectDelay, "Longest pause between two attempts to reconnect to an EPP that is down, for the ext_proc relay and the health checks alike: an EPP that comes back is used again within about this long, whatever the length of its outage (gRPC's own default grows to 120s).")
	fs.StringVar(&o.EPPResponsePhase, "epp-response-phase", o.EPPResponsePhase, "What the EPP that routed a request sees of its response phase (EndpointMode). Relay: the sidecar keeps the EPP's stream open and relays the gateway's response headers, body and trailers (and the served endpoint report) to it, as if the gateway talked to it: its in-flight counts, flow control and usage accounting need it; the gateway waits for the EPP's answers to the headers and trailers, while the chunks of a streamed body go to the gateway unchanged as they go to the EPP, at the model server's pace (an EPP's request to change a chunk already gone is counted in mci_sidecar_epp_late_body_answers_total and logged). Intercept: as Relay, but every body chunk waits for the EPP's answer, for EPPs that rewrite streamed response bodies (a round trip per chunk). Skip: the EPP's stream ends with the request phase and the sidecar lets the response phase through itself, which saves the hop for EPPs that need no response.")
	fs.DurationVar(&o.HealthInterval, "health-check-interval", o.HealthInterval, "Pause between two gRPC health checks of an EPP.")
	fs.DurationVar(&o.HealthTimeout, "health-check-timeout", o.HealthTimeout, "Timeout of one gRPC health check of an EPP.")
	fs.DurationVar(&o.ScrapeInterval, "metrics-scrape-interval", o.ScrapeInterval, "Pause between two scrapes of an EPP's pool metrics (MetricsBased).")
	fs.DurationVar(&o.ScrapeTimeout, "metrics-scrape-timeout", o.ScrapeTimeout, "Timeout of one scrape of an EPP's pool metrics.")
	fs.DurationVar(&o.PrefixSummaryInterval, "prefix-summary-interval", o.PrefixSummaryInterval, "Pause between two asks for an EPP's prompt prefix summary (the prefixes its servers hold, traffic this sidecar does not route included; mci-epp publishes one, upstream EPPs none), at its metrics URL after a good scrape. PrefixAffinity scores a cluster on the longer of the prefixes it reports and this sidecar's own observations. 0: never asked.")
	fs.DurationVar(&o.Scheduling.MetricsStaleness, "metrics-staleness-threshold", o.Scheduling.MetricsStaleness, "Pool metrics older than this make a cluster unmeasured for MetricsBased.")
	fs.IntVar(&o.Scheduling.LowQueueThreshold, "low-queue-threshold", o.Scheduling.LowQueueThreshold, "MetricsBased: critical and standard requests prefer clusters whose pool's average queue is below this.")
	fs.IntVar(&o.Scheduling.SheddableQueueThreshold, "sheddable-queue-threshold", o.Scheduling.SheddableQueueThreshold, "MetricsBased: sheddable requests go only to clusters whose pool's average queue is at most this and average KV cache at most --sheddable-kv-cache-threshold.")
	fs.Float64Var(&o.Scheduling.SheddableKVCacheThreshold, "sheddable-kv-cache-threshold", o.Scheduling.SheddableKVCacheThreshold, "MetricsBased: average KV cache utilization (0 to 1) above which a cluster takes no sheddable request.")
	fs.StringVar(&o.SessionHeader, "session-header", o.SessionHeader, "Request header whose value is a session key (such as x-session-id): policies with the session scorer (PrefixAffinity) keep a session on the cluster that served it last while that cluster is healthy and not saturated. Default: none.")
	fs.StringVar(&o.SessionCookie, "session-cookie", o.SessionCookie, "Cookie whose value is a session key, read when --session-header is absent from a request. Default: none.")
	fs.DurationVar(&o.SessionTTL, "session-ttl", o.SessionTTL, "How long a session stays pinned to its cluster after its last request.")
	fs.IntVar(&o.MaxSessions, "max-sessions", o.MaxSessions, "Most sessions pinned at once; the least recently used go first.")
	fs.IntVar(&o.PrefixIndexBlocks, "prefix-index-blocks", o.PrefixIndexBlocks, "Capacity of the prefix-cache affinity index in prompt blocks of 64 bytes (32 bytes of memory each, allocated at start): which cluster recently served which prompt prefix, for the prefix-cache scorer (PrefixAffinity).")
	fs.BoolVar(&o.ExplainDecisions, "explain-decisions", o.ExplainDecisions, "Add the response header "+sidecar.ScoresHeader+" naming, per cluster, the policy's verdict, tier and scores of the request's cluster decision. (At log level 4 every decision is logged with its scores whatever this says.)")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "On SIGTERM, how long open ext_proc streams may take to finish.")
	fs.StringSliceVar(&o.ServiceClusterIPRanges, "service-cluster-ip-range", o.ServiceClusterIPRanges, "CIDRs of this cluster's Service addresses (kube-apiserver's --service-cluster-ip-range), comma-separated: no remote EPP may name a destination in them. Default: none, which the sidecar logs at start and mci_sidecar_remote_destination_denied_ranges{ranges=\"services\"} shows.")
	fs.StringSliceVar(&o.ClusterCIDRs, "cluster-cidr", o.ClusterCIDRs, "CIDRs of this cluster's Pod addresses (kube-controller-manager's --cluster-cidr), comma-separated: no remote EPP may name a destination in them. Default: none, which the sidecar logs at start and mci_sidecar_remote_destination_denied_ranges{ranges=\"pods\"} shows.")
	fs.StringSliceVar(&o.DeniedDestinationCIDRs, "denied-destination-cidrs", o.DeniedDestinationCIDRs, "More CIDRs no remote EPP may name a destination in, such as the nodes' network. Loopback, link-local (cloud metadata servers), multicast, unspecified and NAT64 addresses are always refused.")
	fs.BoolVar(&o.AllowLoopbackDestinations, "allow-loopback-destinations", o.AllowLoopbackDestinations, "Let remote EPPs name loopback destinations. Only for a ClusterSet on one machine, where every pod has a loopback address (the local ClusterSet of the tests); never in a cluster, where it would let any exporter aim the gateway at the gateway pod's own ports. Logged at start and shown by mci_sidecar_remote_destinations_loopback_allowed.")
	fs.StringSliceVar(&o.RemoteEPPStrippedHeaders, "remote-epp-stripped-headers", o.RemoteEPPStrippedHeaders, "Request headers that never go to a remote cluster's EPP, beyond "+strings.Join(sidecar.DefaultStrippedHeaders, ", ")+", which never do. Comma-separated, case-insensitive.")
	fs.StringSliceVar(&o.RemoteEPPForwardedMetadata, "remote-epp-forwarded-metadata-namespaces", o.RemoteEPPForwardedMetadata, "Filter metadata namespaces of the gateway's metadata_context that a remote cluster's EPP gets (comma-separated). Default: none; a remote EPP gets of it only the endpoint that served the request, which the EPP protocol reports in the response phase. "+extproc.SubsetHintNamespace+", which names this cluster's endpoints, is refused.")
	fs.Int64Var(&o.MaxStreams, "max-streams", o.MaxStreams, "Most ext_proc streams of the gateway served at once (also each connection's HTTP/2 MAX_CONCURRENT_STREAMS); beyond it a stream is answered 503 and counted in mci_sidecar_admission_refused_total. The default suits the chart's 512Mi memory limit.")
	fs.Int64Var(&o.MaxInflightBodyBytes, "max-inflight-body-bytes", o.MaxInflightBodyBytes, "Most request body bytes buffered at once across streams, each counted twice (the body read whole and the messages kept to replay it to the next cluster); a body that would pass it is answered 503 and counted in mci_sidecar_admission_refused_total. The default (256Mi) suits the chart's 512Mi memory limit.")
	o.Outlier.AddFlags(fs)
	version.AddFlag(cmd)
	return cmd
}

// Validate checks the flags.
func (o *Options) Validate() error {
	var errs []error
	if err := o.ServingOptions.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := routingpolicy.Parse(o.DefaultClusterPolicy); err != nil {
		errs = append(errs, fmt.Errorf("--default-cluster-policy: cluster policy: %w", err))
	}
	if o.LocalClusterRegion != "" {
		if msgs := validation.IsDNS1123Label(o.LocalClusterRegion); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--local-cluster-region %q is not a DNS label: %s", o.LocalClusterRegion, strings.Join(msgs, "; ")))
		}
	}
	if _, err := o.gateways(); err != nil {
		errs = append(errs, err)
	}
	if t, err := extproc.ParseListenerTransport(o.ExtProcTLS); err != nil {
		errs = append(errs, fmt.Errorf("--ext-proc-tls %w", err))
	} else if _, err := extproc.ResolveListenerTransport(t, o.TLS, len(o.EndpointPickerServices) > 0); err != nil {
		errs = append(errs, fmt.Errorf("--ext-proc-tls %w", err))
	}
	if _, err := eppaddr.ParseTransport(o.EndpointPickerTransport); err != nil {
		errs = append(errs, fmt.Errorf("--endpoint-picker-transport: %w", err))
	}
	for _, v := range o.InsecureRemoteEPPs {
		if err := routetable.ParseInsecureImport(v); err != nil {
			errs = append(errs, fmt.Errorf("--insecure-remote-endpoint-pickers %w", err))
		}
	}
	if a := o.ExtProcBindAddress; a != "" && net.ParseIP(a) == nil {
		errs = append(errs, fmt.Errorf("--ext-proc-bind-address %q is not an IP address", a))
	}
	if _, err := sidecar.ParseResponsePhase(o.EPPResponsePhase); err != nil {
		errs = append(errs, fmt.Errorf("--epp-response-phase: %w", err))
	}
	if _, err := namespacedNames("--endpoint-picker-service", o.EndpointPickerServices); err != nil {
		errs = append(errs, err)
	}
	for _, ns := range o.SecretNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--endpoint-picker-secret-namespaces %q is not a namespace name: %s", ns, strings.Join(msgs, "; ")))
		}
	}
	for name, d := range map[string]time.Duration{
		"--epp-attempt-timeout": o.EPPAttemptTimeout, "--epp-reconnect-max-delay": o.EPPReconnectDelay, "--health-check-interval": o.HealthInterval, "--health-check-timeout": o.HealthTimeout,
		"--metrics-scrape-interval": o.ScrapeInterval, "--metrics-scrape-timeout": o.ScrapeTimeout, "--drain-timeout": o.DrainTimeout,
		"--epp-drain-timeout": o.EPPDrainTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if o.PrefixSummaryInterval < 0 {
		errs = append(errs, errors.New("--prefix-summary-interval must not be negative"))
	}
	if o.MaxRequestBodyBytes <= 0 {
		errs = append(errs, errors.New("--max-request-body-bytes must be positive"))
	}
	if f := o.EPPMetricsTokenFile; f != "" {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("--epp-metrics-token-file: %w", err))
		}
	}
	for _, r := range o.EPPMetricsTokenTargets {
		if err := eppprobe.ParseTokenRecipient(r); err != nil {
			errs = append(errs, fmt.Errorf("--epp-metrics-token-recipients: %w", err))
		}
	}
	if len(o.EPPMetricsTokenTargets) > 0 && o.EPPMetricsTokenFile == "" {
		errs = append(errs, errors.New("--epp-metrics-token-recipients needs --epp-metrics-token-file"))
	}
	if err := o.Scheduling.Validate(); err != nil {
		errs = append(errs, err)
	}
	for flag, name := range map[string]string{"--session-header": o.SessionHeader, "--session-cookie": o.SessionCookie} {
		if name != "" && !httpguts.ValidHeaderFieldName(name) {
			errs = append(errs, fmt.Errorf("%s %q is not a header or cookie name", flag, name))
		}
	}
	if _, err := o.remoteDestinations(); err != nil {
		errs = append(errs, err)
	}
	for _, h := range o.RemoteEPPStrippedHeaders {
		if !httpguts.ValidHeaderFieldName(h) {
			errs = append(errs, fmt.Errorf("--remote-epp-stripped-headers %q is not a header name", h))
		}
	}
	for _, ns := range o.RemoteEPPForwardedMetadata {
		switch ns {
		case "":
			errs = append(errs, errors.New("--remote-epp-forwarded-metadata-namespaces names an empty namespace"))
		case extproc.SubsetHintNamespace:
			errs = append(errs, fmt.Errorf("--remote-epp-forwarded-metadata-namespaces names %s, which lists this cluster's endpoints: a remote EPP would find none of them and answer 503", ns))
		}
	}
	if o.MaxStreams <= 0 || o.MaxInflightBodyBytes <= 0 {
		errs = append(errs, errors.New("--max-streams and --max-inflight-body-bytes must be positive"))
	} else if o.MaxInflightBodyBytes < 2*o.MaxRequestBodyBytes {
		errs = append(errs, fmt.Errorf("--max-inflight-body-bytes (%d) must hold one body of --max-request-body-bytes counted twice (%d)", o.MaxInflightBodyBytes, 2*o.MaxRequestBodyBytes))
	}
	if o.SessionTTL <= 0 || o.MaxSessions <= 0 || o.PrefixIndexBlocks <= 0 {
		errs = append(errs, errors.New("--session-ttl, --max-sessions and --prefix-index-blocks must be positive"))
	}
	if err := o.Outlier.Validate(); err != nil {
		errs = append(errs, err)
	}
	return utilerrors.NewAggregate(errs)
}

// remoteDestinations is what remote EPPs' destinations are checked
// against: the ranges the flags name, loopback where allowed.
func (o *Options) remoteDestinations() (eppanswer.Policy, error) {
	p := eppanswer.Policy{AllowLoopback: o.AllowLoopbackDestinations}
	for _, f := range []struct {
		flag  string
		cidrs []string
		to    *[]netip.Prefix
	}{
		{"--service-cluster-ip-range", o.ServiceClusterIPRanges, &p.ServiceRanges},
		{"--cluster-cidr", o.ClusterCIDRs, &p.PodRanges},
		{"--denied-destination-cidrs", o.DeniedDestinationCIDRs, &p.Denied},
	} {
		for _, c := range f.cidrs {
			r, err := netip.ParsePrefix(strings.TrimSpace(c))
			if err != nil {
				return eppanswer.Policy{}, fmt.Errorf("%s: %w", f.flag, err)
			}
			*f.to = append(*f.to, r.Masked())
		}
	}
	return p, nil
}

func (o *Options) gateways() ([]types.NamespacedName, error) {
	return namespacedNames("--gateway", o.Gateways)
}

func namespacedNames(flag string, values []string) ([]types.NamespacedName, error) {
	var out []types.NamespacedName
	for _, g := range values {
		ns, name, ok := strings.Cut(g, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%s %q: want namespace/name", flag, g)
		}
		out = append(out, types.NamespacedName{Namespace: ns, Name: name})
	}
	return out, nil
}

// Config turns the flags into the sidecar's configuration.
func (o *Options) Config() (sidecar.Config, error) {
	gws, err := o.gateways()
	if err != nil {
		return sidecar.Config{}, err
	}
	policy, err := routingpolicy.Parse(o.DefaultClusterPolicy)
	if err != nil {
		return sidecar.Config{}, fmt.Errorf("--default-cluster-policy: cluster policy: %w", err)
	}
	shimServices, err := namespacedNames("--endpoint-picker-service", o.EndpointPickerServices)
	if err != nil {
		return sidecar.Config{}, err
	}
	transport, err := eppaddr.ParseTransport(o.EndpointPickerTransport)
	if err != nil {
		return sidecar.Config{}, fmt.Errorf("--endpoint-picker-transport: %w", err)
	}
	responsePhase, err := sidecar.ParseResponsePhase(o.EPPResponsePhase)
	if err != nil {
		return sidecar.Config{}, err
	}
	extProcTransport, err := extproc.ParseListenerTransport(o.ExtProcTLS)
	if err != nil {
		return sidecar.Config{}, fmt.Errorf("--ext-proc-tls %w", err)
	}
	destinations, err := o.remoteDestinations()
	if err != nil {
		return sidecar.Config{}, err
	}
	return sidecar.Config{
		BindAddress:        o.BindAddress,
		ExtProcBindAddress: o.extProcBindAddress(),
		GRPCPort:           o.GRPCPort,
		HealthPort:         o.HealthPort,
		MetricsPort:        o.MetricsPort,
		EnablePprof:        o.EnablePprof,
		TLS:                o.TLS,
		ExtProcTransport:   extProcTransport,
		SecretNamespaces:   o.SecretNamespaces,
		Watch: sidecar.WatchConfig{
			LocalCluster:           o.LocalClusterName,
			LocalRegion:            o.LocalClusterRegion,
			DefaultPolicy:          policy,
			DefaultTransport:       transport,
			RemoteEndpointPickers:  routetable.RemoteEndpointPickers{RequireVerified: true, Insecure: o.InsecureRemoteEPPs},
			Gateways:               gws,
			EndpointPickerServices: shimServices,
			InferenceModels:        o.InferenceModels,
			BackendTLSPolicies:     o.BackendTLSPolicies,
		},
		Server: sidecar.ServerConfig{
			MaxRequestBodyBytes: o.MaxRequestBodyBytes,
			AttemptTimeout:      o.EPPAttemptTimeout,
			EPPDrainTimeout:     o.EPPDrainTimeout,
			ResponsePhase:       responsePhase,
			Scheduling:          o.Scheduling,
			Dial:                epptransport.DialPolicy{MaxDelay: o.EPPReconnectDelay},
			// Header names are matched in lower case, as the gateway
			// sends them.
			Session: clusterscore.SessionSpec{Header: strings.ToLower(o.SessionHeader), Cookie: o.SessionCookie},
			Memory: clusterscore.MemoryOptions{
				PrefixBlocks: o.PrefixIndexBlocks, Sessions: o.MaxSessions, SessionTTL: o.SessionTTL,
				EWMAAlpha: clusterscore.DefaultEWMAAlpha,
			},
			ExplainDecisions:            o.ExplainDecisions,
			RemoteDestinations:          destinations,
			StrippedHeaders:             o.RemoteEPPStrippedHeaders,
			ForwardedMetadataNamespaces: o.RemoteEPPForwardedMetadata,
			MaxStreams:                  o.MaxStreams,
			MaxInflightBodyBytes:        o.MaxInflightBodyBytes,
			Outlier:                     o.Outlier.Config(),
		},
		HealthInterval:         o.HealthInterval,
		HealthTimeout:          o.HealthTimeout,
		ScrapeInterval:         o.ScrapeInterval,
		ScrapeTimeout:          o.ScrapeTimeout,
		PrefixSummaryInterval:  o.PrefixSummaryInterval,
		DrainTimeout:           o.DrainTimeout,
		MetricsTokenFile:       o.EPPMetricsTokenFile,
		MetricsTokenRecipients: o.EPPMetricsTokenTargets,
	}, nil
}

// extProcBindAddress is where the main ext_proc port listens: the flag's
// address; else --bind-address in shim mode (gateways call the sidecar
// through its Service) or when it names one address (a choice made);
// else, for every address, loopback: Envoy beside the sidecar calls it
// there, and nothing else can reach an unauthenticated ext_proc server.
func (o *Options) extProcBindAddress() string {
	switch ip := net.ParseIP(o.BindAddress); {
	case o.ExtProcBindAddress != "":
		return o.ExtProcBindAddress
	case len(o.EndpointPickerServices) > 0 || ip == nil || !ip.IsUnspecified():
		return o.BindAddress
	case ip.To4() == nil:
		return net.IPv6loopback.String()
	default:
		return "127.0.0.1"
	}
}

// metricsFilter is the guard of /metrics the flags ask for; nil: none.
func (o *Options) metricsFilter(kube kubernetes.Interface, logger klog.Logger) (func(http.Handler) http.Handler, error) {
	if !o.MetricsEndpointAuth {
		return nil, nil
	}
	f, err := metricsauth.Delegating(kube, logger.WithName("metrics-auth"))
	if err != nil {
		return nil, err
	}
	return f.Wrap, nil
}

// Run runs the sidecar until ctx ends.
func (o *Options) Run(ctx context.Context) error {
	cfg, err := o.Config()
	if err != nil {
		return err
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("cluster configuration: %w", err)
	}
	// Its informers ask a kube-apiserver that is starting again within a
	// second (noserver), not after the 5 s it asks for.
	restConfig.Wrap(noserver.WithoutRetryAfter)
	var clients sidecar.Clients
	if clients.Kube, err = kubernetes.NewForConfig(restConfig); err != nil {
		return err
	}
	if clients.MCI, err = versioned.NewForConfig(restConfig); err != nil {
		return err
	}
	if clients.Gateway, err = gatewayclient.NewForConfig(restConfig); err != nil {
		return err
	}
	cfg.Watch = followServedAPIs(ctx, clients.Kube.Discovery(), cfg.Watch)
	if cfg.MetricsFilter, err = o.metricsFilter(clients.Kube, klog.FromContext(ctx)); err != nil {
		return err
	}
	s, err := sidecar.New(cfg, clients)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// The optional resources mci-sidecar reads, as API discovery names them.
var (
	apiInferenceModels    = v1alpha2.SchemeGroupVersion.WithResource("inferencemodels")
	apiObjectives         = v1alpha2.SchemeGroupVersion.WithResource("inferenceobjectives")
	apiLLMDObjectives     = llmdv1alpha2.SchemeGroupVersion.WithResource("inferenceobjectives")
	apiBackendTLSPolicies = gatewayv1.SchemeGroupVersion.WithResource("backendtlspolicies")
)

// followServedAPIs turns off the optional resources the cluster does not
// serve (pkg/servedapis, as mci-apiserver and mci-epp ask), so that no
// informer retries forever, and the table does not wait, for a resource
// without a CRD. --inference-models=false and --backend-tls-policies=false
// stay off whatever the cluster serves.
func followServedAPIs(ctx context.Context, d discovery.DiscoveryInterface, w sidecar.WatchConfig) sidecar.WatchConfig {
	served := servedapis.Discover(ctx, d, 0, apiInferenceModels, apiObjectives, apiLLMDObjectives, apiBackendTLSPolicies)
	w.InferenceModels = w.InferenceModels && served.Any(apiInferenceModels, apiObjectives, apiLLMDObjectives)
	w.BackendTLSPolicies = w.BackendTLSPolicies && served.Has(apiBackendTLSPolicies)
	return w
}
