// Package app holds mci-apiserver's flags and turns them into a running
// server: Options -> Config -> CompletedConfig -> MCIServer.
package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/healthz"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	clusterinventory "github.com/mci-dev/mci/pkg/apis/clusterinventory/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apiserver"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/exportstatus"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	generatedopenapi "github.com/mci-dev/mci/pkg/generated/openapi"
	"github.com/mci-dev/mci/pkg/registry/virtual"
	"github.com/mci-dev/mci/pkg/servingcert"
	"github.com/mci-dev/mci/pkg/version"
)

// Options are mci-apiserver's flags.
type Options struct {
	Recommended *genericoptions.RecommendedOptions
	// ServerRun holds the generic server's run flags, graceful shutdown
	// among them.
	ServerRun *genericoptions.ServerRunOptions
	Logs      *logs.Options

	ClusterName         string
	ClusterSetName      string
	Kubeconfig          string
	MemberKubeconfigDir string
	Namespace           string
	UnreachableAfter    time.Duration
	RemoveAfter         time.Duration
	MemberSummaries     string
	WatchHistorySize    int
	// MemberLimits bound what each member may make this server hold.
	MemberLimits clusterset.Limits
	// ServingCertSecret, when set, names the Secret in Namespace that holds
	// a self-signed serving certificate (created when missing) whose CA the
	// server writes into its APIService's caBundle.
	ServingCertSecret string
	// ExportedStatus turns on the writing of the Exported parent status
	// entry on the local cluster's exported InferencePools.
	ExportedStatus bool
	// ClusterProfile* configure the ClusterProfile membership source; it
	// is off while ClusterProfileNamespace is empty.
	ClusterProfileKubeconfig   string
	ClusterProfileNamespace    string
	ClusterProfileProviderFile string
}

// apiServiceName is the APIService that registers this server's group
// version with the aggregator.
var apiServiceName = v1alpha1.SchemeGroupVersion.Version + "." + v1alpha1.SchemeGroupVersion.Group

// apiServiceWait is how long the server waits at start for its APIService
// to exist, with --serving-cert-secret.
const apiServiceWait = 2 * time.Minute

const (
	// defaultHTTP2MaxStreams lets the aggregator multiplex hundreds of
	// proxied watches over one HTTP/2 connection (the generic server
	// allows 100; kube-apiserver itself allows 1000).
	defaultHTTP2MaxStreams = 1000
	// defaultWatchTerminationGracePeriod: at shutdown, open watches are
	// ended (clients re-watch on another replica from their last
	// resourceVersion) and the server waits up to this long for them.
	defaultWatchTerminationGracePeriod = 10 * time.Second
)

// exportedStatusQPS and exportedStatusBurst limit the Exported status
// writes (and the reads that resolve their conflicts).
const (
	exportedStatusQPS   = 20
	exportedStatusBurst = 40
)

// NewOptions returns the defaults. There is no etcd: nothing is stored.
func NewOptions() *Options {
	o := &Options{
		Recommended:      genericoptions.NewRecommendedOptions("", apiserver.Codecs.LegacyCodec(v1alpha1.SchemeGroupVersion)),
		ServerRun:        genericoptions.NewServerRunOptions(),
		Logs:             logs.NewOptions(),
		Namespace:        os.Getenv("POD_NAMESPACE"),
		UnreachableAfter: 10 * time.Second,
		RemoveAfter:      5 * time.Minute,
		MemberSummaries:  string(clusterset.SummariesAuto),
		WatchHistorySize: virtual.DefaultHistorySize,
		MemberLimits:     clusterset.DefaultLimits,
		ExportedStatus:   true,
	}
	o.Recommended.SecureServing.HTTP2MaxStreamsPerConnection = defaultHTTP2MaxStreams
	o.ServerRun.ShutdownWatchTerminationGracePeriod = defaultWatchTerminationGracePeriod
	o.Recommended.Etcd = nil
	o.Recommended.Admission = nil
	o.Recommended.CoreAPI = nil
	// The kube-apiserver in front of us already applies priority and
	// fairness to every request it proxies here.
	o.Recommended.Features.EnablePriorityAndFairness = false
	if o.Namespace == "" {
		o.Namespace = "mci-system"
	}
	return o
}

// NewCommand returns the mci-apiserver command.
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mci-apiserver",
		Short: "Serves InferencePoolImports computed from every member of a ClusterSet",
		Long: `mci-apiserver is a Kubernetes aggregated API server. Registered with an
APIService in a member cluster, it serves InferencePoolImport and
InferencePoolExport (inference.networking.x-k8s.io/v1alpha1) as read-only
resources computed from the InferencePools that members export. Of the
members' objects it writes only, in its own cluster, the Exported parent
status entry of each exported InferencePool (one elected replica writes;
--exported-status turns it off); it writes nothing to any other cluster.`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logsapi.ValidateAndApply(o.Logs, nil); err != nil {
				return err
			}
			version.LogStart(klog.FromContext(cmd.Context()), cmd.Name())
			if err := o.Complete(cmd.Context()); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	o.Recommended.AddFlags(fs)
	o.ServerRun.AddUniversalFlags(fs)
	logsapi.AddFlags(o.Logs, fs)
	fs.StringVar(&o.ClusterName, "cluster-name", o.ClusterName, "Name of the cluster this server serves. Default: the About API ClusterProperty cluster.clusterset.k8s.io of the local cluster.")
	fs.StringVar(&o.ClusterSetName, "clusterset-name", o.ClusterSetName, "Name of the ClusterSet; it seeds the uids of served objects, and selects the ClusterProfiles of --clusterprofile-namespace by their "+clusterinventory.LabelClusterSet+" label. Default: the ClusterProperty clusterset.k8s.io, else \"default\".")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig of the local cluster. Default: the in-cluster configuration.")
	fs.StringVar(&o.MemberKubeconfigDir, "member-kubeconfig-dir", o.MemberKubeconfigDir, "Directory with one kubeconfig file per member cluster, named after the cluster (an optional .kubeconfig/.yaml extension is dropped). Re-read periodically. A file named after the local cluster is ignored.")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "Namespace of the local cluster whose Secrets labelled "+clusterset.MemberClusterLabel+" hold member kubeconfigs, each self-contained (credentials inline: no exec or auth-provider plugin, no file). Default: $POD_NAMESPACE, else mci-system.")
	fs.DurationVar(&o.UnreachableAfter, "member-unreachable-after", o.UnreachableAfter, "How long a member may fail to answer before its clusters are flagged Ready=False with reason ClusterUnreachable (its last known data is kept).")
	fs.BoolVar(&o.ExportedStatus, "exported-status", o.ExportedStatus, "Write, on each InferencePool of the local cluster that carries an export annotation, a status.parents entry for its InferencePoolImport with the Exported condition (upstream proposal 1374). One replica writes, elected with the Lease "+exportstatus.LeaseName+" in --namespace; it writes only when the export state changes. With false nothing is written, and entries written before stay as they are.")
	fs.StringVar(&o.MemberSummaries, "member-summaries", o.MemberSummaries, "How members other than the local cluster are read: \"auto\" reads a member through the InferencePoolExportSummaries and InferenceClusterSummary its own mci-apiserver publishes (two watches, no watch of its objects) when its API discovery lists them, and watches its InferencePools, Namespaces, Services, EndpointSlices and Gateways otherwise; \"never\" always watches its objects. See docs/membership.md.")
	fs.DurationVar(&o.RemoveAfter, "member-remove-after", o.RemoveAfter, "How long a member may fail to answer before its data is dropped: the pools it exported leave the imports (watchers see them change or go) until it answers again. Must exceed --member-unreachable-after.")
	fs.StringVar(&o.ServingCertSecret, "serving-cert-secret", o.ServingCertSecret, "Name of a kubernetes.io/tls Secret in --namespace to serve with, for clusters without cert-manager: when missing, or no longer valid for the Service that APIService "+apiServiceName+" names, or past two thirds of its validity (checked every minute while the server runs), the server creates a certificate signed by a new self-signed CA there, and writes that CA into the APIService's caBundle. Replicas share the Secret. Exclusive with --tls-cert-file.")
	fs.IntVar(&o.WatchHistorySize, "watch-history-size", o.WatchHistorySize, "How many changes of each served resource a watch can resume across (an eighth more are kept between two cuts of the history). A watch from an older resourceVersion is answered 410 Gone and the client relists; each change kept costs about 50 bytes.")
	addMemberLimitFlags(fs, &o.MemberLimits)
	addClusterProfileFlags(fs, o)
	version.AddFlag(cmd)
	return cmd
}

func addClusterProfileFlags(fs *pflag.FlagSet, o *Options) {
	fs.StringVar(&o.ClusterProfileNamespace, "clusterprofile-namespace", o.ClusterProfileNamespace, "Namespace of the hub cluster whose ClusterProfiles (multicluster.x-k8s.io/v1alpha1) labelled "+clusterinventory.LabelClusterSet+"=<--clusterset-name> are members, each named after its profile. Empty: ClusterProfiles are not read.")
	fs.StringVar(&o.ClusterProfileKubeconfig, "clusterprofile-kubeconfig", o.ClusterProfileKubeconfig, "Kubeconfig of the hub cluster that holds the ClusterProfiles. Default: the local cluster's connection (--kubeconfig, else in-cluster).")
	fs.StringVar(&o.ClusterProfileProviderFile, "clusterprofile-provider-file", o.ClusterProfileProviderFile, "Provider file (KEP-5339, JSON or YAML: {\"providers\": [{\"name\": ..., \"execConfig\": {...}}]}) that maps the access providers a ClusterProfile offers to exec credential plugins; a member is reached through the first provider of the file that its profile offers. Commands come only from this file. Re-read periodically. Required with --clusterprofile-namespace.")
}

// Complete fills in what the flags leave to discovery.
func (o *Options) Complete(ctx context.Context) error {
	if o.ClusterName != "" && o.ClusterSetName != "" {
		return nil
	}
	config, err := o.localConfig()
	if err != nil {
		return err
	}
	props, err := clusterProperties(ctx, config)
	if err != nil {
		return err
	}
	if o.ClusterName == "" {
		o.ClusterName = props["cluster.clusterset.k8s.io"]
	}
	if o.ClusterSetName == "" {
		o.ClusterSetName = props["clusterset.k8s.io"]
	}
	if o.ClusterSetName == "" {
		o.ClusterSetName = "default"
	}
	return nil
}

// clusterProperties reads the About API's ClusterProperties; a cluster
// without the About API has none.
func clusterProperties(ctx context.Context, config *rest.Config) (map[string]string, error) {
	client, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	gvr := schema.GroupVersionResource{Group: "about.k8s.io", Version: "v1alpha1", Resource: "clusterproperties"}
	list, err := client.Resource(gvr).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ClusterProperties: %w", err)
	}
	props := map[string]string{}
	for _, item := range list.Items {
		if v, ok := item.Object["spec"].(map[string]interface{})["value"].(string); ok {
			props[item.GetName()] = v
		}
	}
	return props, nil
}

// Validate checks the flags.
func (o *Options) Validate() error {
	var errs []error
	if o.ClusterName == "" {
		errs = append(errs, fmt.Errorf("--cluster-name is required when the local cluster has no ClusterProperty cluster.clusterset.k8s.io"))
	}
	if o.UnreachableAfter <= 0 {
		errs = append(errs, fmt.Errorf("--member-unreachable-after must be positive"))
	}
	if o.RemoveAfter <= o.UnreachableAfter {
		errs = append(errs, fmt.Errorf("--member-remove-after (%s) must exceed --member-unreachable-after (%s)", o.RemoveAfter, o.UnreachableAfter))
	}
	errs = append(errs, validateMemberLimits(o.MemberLimits)...)
	if o.WatchHistorySize < 1 {
		errs = append(errs, fmt.Errorf("--watch-history-size must be at least 1, not %d", o.WatchHistorySize))
	}
	switch clusterset.Summaries(o.MemberSummaries) {
	case clusterset.SummariesAuto, clusterset.SummariesNever:
	default:
		errs = append(errs, fmt.Errorf("--member-summaries must be auto or never, not %q", o.MemberSummaries))
	}
	errs = append(errs, o.validateClusterProfiles()...)
	if o.ServingCertSecret != "" && o.Recommended.SecureServing.ServerCert.CertKey.CertFile != "" {
		errs = append(errs, fmt.Errorf("--serving-cert-secret and --tls-cert-file are exclusive: serve either the certificate the server keeps in a Secret or the one in the file"))
	}
	errs = append(errs, o.Recommended.Validate()...)
	errs = append(errs, o.ServerRun.Validate()...)
	return utilerrors.NewAggregate(errs)
}

// validateClusterProfiles checks the flags of the ClusterProfile source.
func (o *Options) validateClusterProfiles() []error {
	var errs []error
	if o.ClusterProfileNamespace != "" && o.ClusterProfileProviderFile == "" {
		errs = append(errs, fmt.Errorf("--clusterprofile-provider-file is required with --clusterprofile-namespace: it says which plugin provides each kind of access"))
	}
	if o.ClusterProfileNamespace != "" {
		if msgs := validation.IsValidLabelValue(o.ClusterSetName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--clusterset-name %q cannot select ClusterProfiles by their %s label: %s", o.ClusterSetName, clusterinventory.LabelClusterSet, strings.Join(msgs, "; ")))
		}
	}
	if o.ClusterProfileNamespace == "" && (o.ClusterProfileProviderFile != "" || o.ClusterProfileKubeconfig != "") {
		errs = append(errs, fmt.Errorf("--clusterprofile-provider-file and --clusterprofile-kubeconfig need --clusterprofile-namespace"))
	}
	return errs
}

func (o *Options) localConfig() (*rest.Config, error) {
	if o.Kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	}
	return rest.InClusterConfig()
}

// Config turns the options into a server configuration: the generic
// server's, the members' sources and the Exported status writer.
func (o *Options) Config() (*apiserver.Config, error) {
	local, err := o.localConfig()
	if err != nil {
		return nil, fmt.Errorf("local cluster configuration: %w", err)
	}
	generic, err := o.genericConfig()
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(local)
	if err != nil {
		return nil, err
	}
	exported, err := o.exportedStatusConfig(local, kube)
	if err != nil {
		return nil, err
	}
	sources, err := o.memberSources(local, kube)
	if err != nil {
		return nil, err
	}
	return &apiserver.Config{
		GenericConfig: generic,
		ExtraConfig: apiserver.ExtraConfig{
			ClusterSet: clusterset.Options{
				ClusterSetName:   o.ClusterSetName,
				LocalName:        o.ClusterName,
				Local:            local,
				UnreachableAfter: o.UnreachableAfter,
				RemoveAfter:      o.RemoveAfter,
				Summaries:        clusterset.Summaries(o.MemberSummaries),
				Limits:           o.MemberLimits,
			},
			Sources:          sources,
			ExportedStatus:   exported,
			WatchHistorySize: o.WatchHistorySize,
		},
	}, nil
}

// genericConfig is the generic API server's configuration: serving
// certificates (self-signed when none is given), delegated authentication
// and authorization, OpenAPI, and readiness.
func (o *Options) genericConfig() (*genericapiserver.RecommendedConfig, error) {
	if o.Recommended.SecureServing.ServerCert.GeneratedCert == nil {
		if err := o.Recommended.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
			return nil, fmt.Errorf("creating self-signed certificates: %w", err)
		}
	}
	// Delegated authentication and authorization use the local cluster too
	// unless their own kubeconfig flags say otherwise.
	if o.Kubeconfig != "" {
		if o.Recommended.Authentication.RemoteKubeConfigFile == "" {
			o.Recommended.Authentication.RemoteKubeConfigFile = o.Kubeconfig
		}
		if o.Recommended.Authorization.RemoteKubeConfigFile == "" {
			o.Recommended.Authorization.RemoteKubeConfigFile = o.Kubeconfig
		}
	}

	generic := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	if err := o.ServerRun.ApplyTo(&generic.Config); err != nil {
		return nil, err
	}
	// A replica is ready once every member has listed, is past
	// --member-remove-after, or answers but is flagged for what keeps it
	// from listing (clusterset.Cache.Ready): one that starts while
	// a member is unreachable must not serve that member's pools as gone
	// while other replicas still serve them. The wait for storage
	// readiness (after which the server becomes ready regardless, with a
	// warning) covers that threshold and a minute to list.
	generic.StorageInitializationTimeout = max(generic.StorageInitializationTimeout, o.RemoveAfter+time.Minute)
	// The version the generic server gates features by is that of the
	// Kubernetes libraries it is built with; /version reports mci's.
	generic.EffectiveVersion = version.Served(utilcompatibility.DefaultBuildEffectiveVersion())
	namer := openapi.NewDefinitionNamer(apiserver.Scheme)
	generic.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(generatedopenapi.GetOpenAPIDefinitions, namer)
	generic.OpenAPIConfig.Info.Title = "mci"
	generic.OpenAPIConfig.Info.Version = "v1alpha1"
	generic.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(generatedopenapi.GetOpenAPIDefinitions, namer)
	generic.OpenAPIV3Config.Info.Title = "mci"
	generic.OpenAPIV3Config.Info.Version = "v1alpha1"
	if err := o.Recommended.ApplyTo(generic); err != nil {
		return nil, err
	}
	if rh := generic.Authentication.RequestHeaderConfig; rh != nil && rh.CAContentProvider != nil {
		generic.AddReadyzChecks(aggregatorCALoaded(rh.CAContentProvider))
	}
	return generic, nil
}

// aggregatorCALoaded is a readiness check that fails until the CA that
// signs the aggregator's client certificate is loaded. k8s.io/apiserver
// loads it from the extension-apiserver-authentication ConfigMap through
// an informer that starts with the server, so for its first 100 ms or so
// a replica takes every request the aggregator proxies as anonymous and
// refuses it 403: a summary reader told 403 lists again. Not ready, the
// replica gets no request through its Service meanwhile.
func aggregatorCALoaded(ca dynamiccertificates.CAContentProvider) healthz.HealthChecker {
	return healthz.NamedCheck("aggregator-client-ca", func(*http.Request) error {
		if len(ca.CurrentCABundleContent()) == 0 {
			return fmt.Errorf("the CA of the aggregator's client certificate (%s) is not loaded yet: its requests would be taken as anonymous", ca.Name())
		}
		return nil
	})
}

// memberSources are where the members' kubeconfigs come from, in the
// order that decides a cluster two of them name: the member directory
// when set, the labelled Secrets of the server's namespace, and the
// ClusterProfiles of the hub with --clusterprofile-namespace.
func (o *Options) memberSources(local *rest.Config, kube kubernetes.Interface) ([]clusterset.Source, error) {
	var sources []clusterset.Source
	if o.MemberKubeconfigDir != "" {
		sources = append(sources, clusterset.DirSource{Dir: o.MemberKubeconfigDir})
	}
	sources = append(sources, clusterset.SecretSource{Client: kube, Namespace: o.Namespace})
	if o.ClusterProfileNamespace == "" {
		return sources, nil
	}
	hub := local
	if o.ClusterProfileKubeconfig != "" {
		var err error
		if hub, err = clientcmd.BuildConfigFromFlags("", o.ClusterProfileKubeconfig); err != nil {
			return nil, fmt.Errorf("--clusterprofile-kubeconfig: %w", err)
		}
	}
	client, err := mciclient.NewForConfig(hub)
	if err != nil {
		return nil, fmt.Errorf("--clusterprofile-kubeconfig: %w", err)
	}
	return append(sources, clusterset.ProfileSource{
		Client:       client,
		Namespace:    o.ClusterProfileNamespace,
		ClusterSet:   o.ClusterSetName,
		ProviderFile: o.ClusterProfileProviderFile,
	}), nil
}

// exportedStatusConfig is what writes the Exported entry of local pools'
// status, under leader election; nil when --exported-status is off.
func (o *Options) exportedStatusConfig(local *rest.Config, kube kubernetes.Interface) (*apiserver.ExportedStatusConfig, error) {
	if !o.ExportedStatus {
		return nil, nil
	}
	// One write per exported pool at start-up, then one per change of
	// export state: 10,000 exported pools take about 8 minutes at
	// start-up rather than half an hour at client-go's default 5/s,
	// without crowding the cluster's other writers.
	statusConfig := rest.CopyConfig(local)
	statusConfig.QPS, statusConfig.Burst = exportedStatusQPS, exportedStatusBurst
	pools, err := mciclient.NewForConfig(statusConfig)
	if err != nil {
		return nil, err
	}
	identity, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("naming this replica for leader election: %w", err)
	}
	return &apiserver.ExportedStatusConfig{
		Pools: pools.InferencePoolV1(),
		Election: exportstatus.Election{
			Leases:    kube.CoordinationV1(),
			Namespace: o.Namespace,
			Identity:  identity + "_" + string(uuid.NewUUID()),
		},
	}, nil
}

// Run starts the server and blocks until ctx ends.
func (o *Options) Run(ctx context.Context) error {
	if o.ServingCertSecret != "" {
		if err := o.useServingCertSecret(ctx); err != nil {
			return err
		}
	}
	config, err := o.Config()
	if err != nil {
		return err
	}
	server, err := config.Complete().New()
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Serving", "cluster", o.ClusterName, "clusterSet", o.ClusterSetName)
	return server.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}

// useServingCertSecret serves with the certificate of --serving-cert-secret,
// creating or renewing it, and makes the APIService trust it.
func (o *Options) useServingCertSecret(ctx context.Context) error {
	local, err := o.localConfig()
	if err != nil {
		return fmt.Errorf("local cluster configuration: %w", err)
	}
	kube, err := kubernetes.NewForConfig(local)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(local)
	if err != nil {
		return err
	}
	// The generic API server runs it (a ControllerRunner): it renews the
	// certificate while the server runs, and new handshakes get the new one.
	serving, err := servingcert.NewServing(ctx, kube, dyn, servingcert.Options{
		Namespace:      o.Namespace,
		SecretName:     o.ServingCertSecret,
		APIService:     apiServiceName,
		APIServiceWait: apiServiceWait,
	})
	if err != nil {
		return fmt.Errorf("--serving-cert-secret: %w", err)
	}
	o.Recommended.SecureServing.ServerCert.GeneratedCert = serving
	return nil
}
