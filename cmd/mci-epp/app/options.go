// Package app holds mci-epp's flags and turns them into a running Endpoint
// Picker: a fixed list of model servers (standalone) or an InferencePool in a
// cluster (Kubernetes mode).
package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/metricsauth"
	"github.com/mci-dev/mci/pkg/noserver"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/version"
)

// Options are mci-epp's flags.
type Options struct {
	Logs *logs.Options

	extproc.ServingOptions
	SecureServing bool
	// MetricsEndpointAuth and MetricsTokenFile guard /metrics; PoolMetricsNames
	// names the pool gauges.
	MetricsEndpointAuth bool
	MetricsTokenFile    string
	PoolMetricsNames    string
	// ModelServerMaxNumSeqs is the model servers' batch places, published
	// with the pool gauges.
	ModelServerMaxNumSeqs int

	PoolName      string
	PoolNamespace string
	Kubeconfig    string
	// ModelServerDiscovery, ModelServerService, ModelServerAddress and
	// MetadataRefresh say where the Kubernetes mode finds the model
	// servers and how often it reads their /metadata (epp.KubeSource).
	ModelServerDiscovery string
	ModelServerService   string
	ModelServerAddress   string
	MetadataRefresh      time.Duration

	Endpoints   []string
	ModelConfig string

	BaseModels          []string
	MaxFallbacks        int
	MaxRequestBodyBytes int64
	ScrapeInterval      time.Duration
	Scheduling          scheduling.Config
}

// NewOptions returns the defaults: the ports of the Endpoint Picker
// convention (ext_proc 9002, health 9003, metrics 9090) and seed 001's
// thresholds.
func NewOptions() *Options {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "default"
	}
	serving := extproc.NewServingOptions()
	serving.HealthPortUsage = "liveness, readiness and the ext_proc service turn SERVING once the model servers are known."
	return &Options{
		Logs:                logs.NewOptions(),
		ServingOptions:      serving,
		PoolNamespace:       ns,
		MaxRequestBodyBytes: requestmodel.DefaultMaxRequestBodyBytes,
		ScrapeInterval:      metrics.DefaultInterval,
		Scheduling:          scheduling.DefaultConfig(),
		PoolMetricsNames:    poolNamesGIE,

		ModelServerDiscovery: epp.InstancesFromPods,
		ModelServerAddress:   epp.AddressFromEndpoint,
		MetadataRefresh:      epp.DefaultMetadataRefresh,
	}
}

// The values of --pool-metrics-names.
const (
	poolNamesGIE  = "inference_pool"
	poolNamesLLMD = "llm_d_epp"
	poolNamesBoth = "both"
)

// poolMetricsSchemes are the naming schemes --pool-metrics-names asks for.
func (o *Options) poolMetricsSchemes() ([]metrics.PoolScheme, error) {
	switch o.PoolMetricsNames {
	case poolNamesGIE:
		return []metrics.PoolScheme{metrics.GIEScheme}, nil
	case poolNamesLLMD:
		return []metrics.PoolScheme{metrics.LLMDScheme}, nil
	case poolNamesBoth:
		return []metrics.PoolScheme{metrics.LLMDScheme, metrics.GIEScheme}, nil
	default:
		return nil, fmt.Errorf("--pool-metrics-names %q: want %s, %s or %s", o.PoolMetricsNames, poolNamesGIE, poolNamesLLMD, poolNamesBoth)
	}
}

// NewCommand returns the mci-epp command.
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mci-epp",
		Short: "Endpoint Picker for one InferencePool: picks a model server for each inference request",
		Long: `mci-epp is an Envoy ext_proc server that speaks the Endpoint Picker protocol
of the Gateway API Inference Extension for one InferencePool. For each request
it reads the model from the OpenAI-style body, maps it through the pool's
InferenceObjectives (the x-gateway-inference-objective header's priority;
below 0 is sheddable), InferenceModelRewrites (weighted model rewrites) and
InferenceModels (criticality, weighted target models), and picks a model
server from their vLLM metrics. InferenceObjective and InferenceModelRewrite
are read in both inference.networking.x-k8s.io/v1alpha2 and llm-d.ai/v1alpha2.

Standalone:  mci-epp --endpoints 10.0.0.1:8000,10.0.0.2:8000 --model-config models.yaml
Kubernetes:  mci-epp --pool-name my-pool [--pool-namespace ns] [--kubeconfig FILE]
             [--model-server-discovery endpointslices --model-server-service my-servers]

In Kubernetes mode each model server's /metadata (seed 002), when it serves
one, says which models and LoRA adapters it serves: a request goes only to
servers that serve its target model, and gets 404 when no ready server does.`,
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
	o.ServingOptions.AddFlags(fs)
	fs.BoolVar(&o.SecureServing, "secure-serving", o.SecureServing, "Serve ext_proc over TLS with a self-signed certificate, for gateways that encrypt without verifying. --tls-cert-file serves a real certificate on every port instead.")
	fs.BoolVar(&o.MetricsEndpointAuth, "metrics-endpoint-auth", o.MetricsEndpointAuth, "Serve /metrics only to bearer tokens, as upstream EPPs do by default: in Kubernetes mode the pool's cluster authenticates the token (TokenReview) and authorizes get on the non-resource URL /metrics (SubjectAccessReview); the EPP's identity needs create on tokenreviews and subjectaccessreviews. Without a token 401, with a token not allowed 403. Off by default, so that the local ClusterSet and tests scrape it freely.")
	fs.StringVar(&o.MetricsTokenFile, "metrics-token-file", o.MetricsTokenFile, "With --metrics-endpoint-auth: accept the tokens of this file instead of asking the cluster (kube-apiserver's --token-auth-file format: token,user,uid,\"groups\"; every user it names may read /metrics). Required in standalone mode.")
	fs.StringVar(&o.PoolMetricsNames, "pool-metrics-names", o.PoolMetricsNames, "Names of the pool gauges on /metrics: inference_pool (the Gateway API Inference Extension EPP's: inference_pool_average_queue_size, ..._kv_cache_utilization, inference_pool_ready_pods), llm_d_epp (the llm-d router EPP's: llm_d_epp_average_queue_size, ..._kv_cache_utilization, llm_d_epp_ready_endpoints) or both (as llm-d serves them).")
	fs.IntVar(&o.ModelServerMaxNumSeqs, "model-server-max-num-seqs", o.ModelServerMaxNumSeqs, "The batch places of each model server of the pool: the --max-num-seqs they run with (vLLM's, or its simulators'), which no model server publishes as a metric. Set, the pool gauges carry it (mci_epp_pool_average_batch_capacity) beside the servers' average running requests (vllm:num_requests_running), so that a router tells a batch full of traffic it does not see before requests queue there. 0: not published.")
	fs.StringVar(&o.PoolName, "pool-name", o.PoolName, "Name of the InferencePool. Required in Kubernetes mode; in standalone mode it only labels the metrics.")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", o.PoolNamespace, "Namespace of the InferencePool (Kubernetes mode). Default: $POD_NAMESPACE, else default.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig of the pool's cluster (Kubernetes mode). Default: the in-cluster configuration.")
	fs.StringVar(&o.ModelServerDiscovery, "model-server-discovery", o.ModelServerDiscovery, "Kubernetes mode: where the model servers come from: pods (the InferencePool's selector picks Ready pods with a status.podIP) or endpointslices (the ready endpoints of --model-server-service's EndpointSlices, each identified by its targetRef, as seed 002 describes). Either way requests go to the InferencePool's first target port.")
	fs.StringVar(&o.ModelServerService, "model-server-service", o.ModelServerService, "Kubernetes mode with --model-server-discovery=endpointslices: the Service, in --pool-namespace, whose EndpointSlices (kubernetes.io/service-name) list the model servers.")
	fs.StringVar(&o.ModelServerAddress, "model-server-address", o.ModelServerAddress, "Kubernetes mode with --model-server-discovery=endpointslices: which address of an endpoint requests and /metadata go to: endpoint (its first address) or pod-ip (its targetRef Pod's status.podIP, the same address in a cluster, for slices that cannot carry the model servers' address, like the local ClusterSet's loopback ones; needs list and watch on pods).")
	fs.DurationVar(&o.MetadataRefresh, "model-server-metadata-refresh", o.MetadataRefresh, "Kubernetes mode: how often each model server's /metadata (seed 002: the models and LoRA adapters it serves) is read again; a server that has none (404) takes any model, a failed read keeps the last valid metadata.")
	fs.StringSliceVar(&o.Endpoints, "endpoints", o.Endpoints, "Standalone mode: the model servers, ip:port[,ip:port...]; each serves inference and /metrics on that port.")
	fs.StringVar(&o.ModelConfig, "model-config", o.ModelConfig, "Standalone mode: a YAML file of InferenceModel (inference.networking.x-k8s.io/v1alpha2), InferenceObjective and InferenceModelRewrite (inference.networking.x-k8s.io/v1alpha2 or llm-d.ai/v1alpha2) objects separated by ---. A document the CRDs would refuse is a startup error.")
	fs.StringSliceVar(&o.BaseModels, "base-models", o.BaseModels, "Names the model servers serve their base model under. A request for one of them needs no LoRA adapter; any other target model is taken for an adapter.")
	fs.IntVar(&o.MaxFallbacks, "max-fallback-endpoints", o.MaxFallbacks, "How many fallback endpoints follow the picked one in the destination (ip:port,ip:port,...), each picked by the same policy among the rest.")
	fs.Int64Var(&o.MaxRequestBodyBytes, "max-request-body-bytes", o.MaxRequestBodyBytes, "Largest request body buffered; larger requests get 413.")
	fs.DurationVar(&o.ScrapeInterval, "metrics-scrape-interval", o.ScrapeInterval, "Pause between two scrapes of a model server's metrics.")
	fs.DurationVar(&o.Scheduling.MetricsStaleness, "metrics-staleness-threshold", o.Scheduling.MetricsStaleness, "Metrics older than this make a model server unknown to the scheduler (it never wins against a measured one).")
	fs.IntVar(&o.Scheduling.LowQueueThreshold, "low-queue-threshold", o.Scheduling.LowQueueThreshold, "Critical and Standard requests prefer model servers with fewer waiting requests than this.")
	fs.IntVar(&o.Scheduling.SheddableQueueThreshold, "sheddable-queue-threshold", o.Scheduling.SheddableQueueThreshold, "Sheddable requests go only to model servers with at most this many waiting requests and at most --sheddable-kv-cache-threshold KV cache utilization; with none, they get 429.")
	fs.Float64Var(&o.Scheduling.SheddableKVCacheThreshold, "sheddable-kv-cache-threshold", o.Scheduling.SheddableKVCacheThreshold, "KV cache utilization (0 to 1) above which a model server takes no sheddable request.")
	fs.IntVar(&o.Scheduling.PrefixQueueMargin, "prefix-queue-margin", o.Scheduling.PrefixQueueMargin, "A request goes to the model server likely to hold the longest prefix of its prompt in its prefix cache (where earlier prompts went) when that server's waiting queue is at most this many requests longer than the least one's and its KV cache utilization at most --sheddable-kv-cache-threshold; beyond that, load decides. Negative: prompts play no part in the pick.")
	version.AddFlag(cmd)
	return cmd
}

// standalone reports whether the flags ask for the standalone mode.
func (o *Options) standalone() bool { return len(o.Endpoints) > 0 }

// Validate checks the flags.
func (o *Options) Validate() error {
	var errs []error
	if err := o.ServingOptions.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.standalone() {
		if o.Kubeconfig != "" {
			errs = append(errs, errors.New("--kubeconfig is for the Kubernetes mode; --endpoints selects the standalone mode"))
		}
	} else {
		if o.PoolName == "" {
			errs = append(errs, errors.New("either --endpoints (standalone mode) or --pool-name (Kubernetes mode) is required"))
		}
		errs = append(errs, o.validateModelServers()...)
		if o.ModelConfig != "" {
			errs = append(errs, errors.New("--model-config is for the standalone mode (with --endpoints); in Kubernetes mode the InferenceModels, InferenceObjectives and InferenceModelRewrites come from the cluster"))
		}
	}
	if o.MetricsTokenFile != "" && !o.MetricsEndpointAuth {
		errs = append(errs, errors.New("--metrics-token-file needs --metrics-endpoint-auth"))
	}
	if o.MetricsEndpointAuth && o.standalone() && o.MetricsTokenFile == "" {
		errs = append(errs, errors.New("--metrics-endpoint-auth in standalone mode needs --metrics-token-file: there is no cluster to review tokens"))
	}
	if _, err := o.poolMetricsSchemes(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxFallbacks < 0 {
		errs = append(errs, errors.New("--max-fallback-endpoints must not be negative"))
	}
	if o.ModelServerMaxNumSeqs < 0 {
		errs = append(errs, errors.New("--model-server-max-num-seqs must not be negative"))
	}
	if o.MaxRequestBodyBytes <= 0 {
		errs = append(errs, errors.New("--max-request-body-bytes must be positive"))
	}
	if o.ScrapeInterval <= 0 {
		errs = append(errs, errors.New("--metrics-scrape-interval must be positive"))
	}
	if err := o.Scheduling.Validate(); err != nil {
		errs = append(errs, err)
	}
	return utilerrors.NewAggregate(errs)
}

// validateModelServers checks the flags that say where the Kubernetes mode
// finds the model servers.
func (o *Options) validateModelServers() []error {
	var errs []error
	fromSlices := o.ModelServerDiscovery == epp.InstancesFromEndpointSlices
	switch {
	case o.ModelServerDiscovery != epp.InstancesFromPods && !fromSlices:
		errs = append(errs, fmt.Errorf("--model-server-discovery %q: want %s or %s", o.ModelServerDiscovery, epp.InstancesFromPods, epp.InstancesFromEndpointSlices))
	case fromSlices && o.ModelServerService == "":
		errs = append(errs, errors.New("--model-server-discovery=endpointslices needs --model-server-service, the Service whose EndpointSlices list the model servers"))
	case !fromSlices && o.ModelServerService != "":
		errs = append(errs, errors.New("--model-server-service is for --model-server-discovery=endpointslices"))
	}
	switch o.ModelServerAddress {
	case epp.AddressFromEndpoint:
	case epp.AddressFromPodIP:
		if !fromSlices {
			errs = append(errs, errors.New("--model-server-address=pod-ip is for --model-server-discovery=endpointslices (pods are always reached at their status.podIP)"))
		}
	default:
		errs = append(errs, fmt.Errorf("--model-server-address %q: want %s or %s", o.ModelServerAddress, epp.AddressFromEndpoint, epp.AddressFromPodIP))
	}
	if o.MetadataRefresh <= 0 {
		errs = append(errs, errors.New("--model-server-metadata-refresh must be positive"))
	}
	return errs
}

// Source builds the candidate source the flags describe.
func (o *Options) Source() (epp.Source, error) {
	if o.standalone() {
		eps, err := epp.ParseEndpoints(o.Endpoints)
		if err != nil {
			return nil, fmt.Errorf("--endpoints: %w", err)
		}
		src := epp.StaticSource{Endpoints: eps}
		if o.ModelConfig != "" {
			f, err := os.Open(o.ModelConfig)
			if err != nil {
				return nil, fmt.Errorf("--model-config: %w", err)
			}
			defer func() { _ = f.Close() }()
			if src.Config, err = requestmodel.LoadModelConfig(f); err != nil {
				return nil, fmt.Errorf("--model-config %s: %w", o.ModelConfig, err)
			}
		}
		return src, nil
	}

	config, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	client, err := versioned.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	return o.kubeSource(client, kube), nil
}

// kubeSource is the Kubernetes mode's source of the flags.
func (o *Options) kubeSource(client versioned.Interface, kube kubernetes.Interface) *epp.KubeSource {
	return &epp.KubeSource{
		Client:          client,
		Kube:            kube,
		Namespace:       o.PoolNamespace,
		PoolName:        o.PoolName,
		Instances:       o.ModelServerDiscovery,
		Service:         o.ModelServerService,
		Address:         o.ModelServerAddress,
		MetadataRefresh: o.MetadataRefresh,
	}
}

func (o *Options) restConfig() (*rest.Config, error) {
	config, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("cluster configuration: %w", err)
	}
	// Its informers ask a kube-apiserver that is starting again within a
	// second (noserver), not after the 5 s it asks for.
	config.Wrap(noserver.WithoutRetryAfter)
	return config, nil
}

// metricsFilter builds the guard of /metrics the flags ask for; nil: none.
func (o *Options) metricsFilter(logger klog.Logger) (func(http.Handler) http.Handler, error) {
	if !o.MetricsEndpointAuth {
		return nil, nil
	}
	logger = logger.WithName("metrics-auth")
	var f *metricsauth.Filter
	if o.MetricsTokenFile != "" {
		var err error
		if f, err = metricsauth.Static(o.MetricsTokenFile, logger); err != nil {
			return nil, fmt.Errorf("--metrics-token-file: %w", err)
		}
	} else {
		config, err := o.restConfig()
		if err != nil {
			return nil, err
		}
		kube, err := kubernetes.NewForConfig(config)
		if err != nil {
			return nil, err
		}
		if f, err = metricsauth.Delegating(kube, logger); err != nil {
			return nil, err
		}
	}
	return f.Wrap, nil
}

// Run runs the Endpoint Picker until ctx ends.
func (o *Options) Run(ctx context.Context) error {
	src, err := o.Source()
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if static, ok := src.(epp.StaticSource); ok {
		// The file is this EPP's configuration: its objects apply whatever
		// pool they name, but say so.
		otherPool := func(kind, name, ref string) {
			if o.PoolName != "" && ref != "" && ref != o.PoolName {
				logger.Info("Model configuration object names another pool; applying it anyway", "kind", kind, "name", name, "poolRef", ref, "pool", o.PoolName)
			}
		}
		for _, im := range static.Config.Models {
			otherPool("InferenceModel", im.Name, im.Spec.PoolRef.Name)
		}
		for _, obj := range static.Config.Objectives {
			otherPool("InferenceObjective", obj.Name, obj.Spec.PoolRef.Name)
		}
		for _, rw := range static.Config.Rewrites {
			otherPool("InferenceModelRewrite", rw.Name, rw.Spec.PoolRef.Name)
		}
	}
	schemes, err := o.poolMetricsSchemes()
	if err != nil {
		return err
	}
	filter, err := o.metricsFilter(logger)
	if err != nil {
		return err
	}
	e, err := epp.New(epp.Config{
		PoolMetricsSchemes:  schemes,
		MaxNumSeqs:          o.ModelServerMaxNumSeqs,
		MetricsFilter:       filter,
		BindAddress:         o.BindAddress,
		GRPCPort:            o.GRPCPort,
		HealthPort:          o.HealthPort,
		MetricsPort:         o.MetricsPort,
		EnablePprof:         o.EnablePprof,
		SecureServing:       o.SecureServing,
		TLS:                 o.TLS,
		PoolName:            o.PoolName,
		MaxRequestBodyBytes: o.MaxRequestBodyBytes,
		ScrapeInterval:      o.ScrapeInterval,
		Picker: epp.PickerConfig{
			Scheduling:   o.Scheduling,
			MaxFallbacks: o.MaxFallbacks,
			BaseModels:   o.BaseModels,
		},
	}, src)
	if err != nil {
		return err
	}
	return e.Run(ctx)
}
