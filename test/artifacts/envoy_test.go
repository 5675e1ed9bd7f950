package artifacts

import (
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/mci-dev/mci/cmd/mci-sidecar/app"

	// The typed_config types the configuration names, registered for
	// protojson's Any resolution.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/health_check/v3"
)

const (
	envoyConfig       = "../../artifacts/envoy/envoy.yaml"
	envoyConfigMap    = "../../artifacts/deploy/mci-sidecar/30-envoy-config.yaml"
	sidecarDeployment = "../../artifacts/deploy/mci-sidecar/40-deployment.yaml"
	destinationHdr    = "x-gateway-destination-endpoint"
	sidecarGRPCPort   = 9002
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// loadBootstrap parses an Envoy configuration as Envoy does (YAML is JSON
// for protobuf), rejecting unknown fields and types, and checks the
// constraints the proto declares, of the bootstrap and of every typed
// config inside it.
func loadBootstrap(t *testing.T, data []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := yaml.YAMLToJSON(data)
	require.NoError(t, err)
	b := &bootstrapv3.Bootstrap{}
	require.NoError(t, protojson.Unmarshal(js, b), "the configuration is not a valid Envoy bootstrap")
	require.NoError(t, b.ValidateAll())
	validateAnys(t, b.ProtoReflect().Interface())
	return b
}

// validateAnys validates the message of every Any under m, recursively:
// the bootstrap's own validation only checks their type URLs.
func validateAnys(t *testing.T, m proto.Message) {
	t.Helper()
	var walk func(m proto.Message)
	walk = func(m proto.Message) {
		if a, ok := m.(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			require.NoError(t, err, "typed_config %s", a.GetTypeUrl())
			if v, ok := inner.(validator); ok {
				require.NoError(t, v.ValidateAll(), "typed_config %s", a.GetTypeUrl())
			}
			walk(inner)
			return
		}
		r := m.ProtoReflect()
		r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message().Interface())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message().Interface())
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message().Interface())
			}
			return true
		})
	}
	walk(m)
}

func unpack[T proto.Message](t *testing.T, a *anypb.Any, into T) T {
	t.Helper()
	require.NoError(t, a.UnmarshalTo(into), "typed_config %s", a.GetTypeUrl())
	return into
}

func TestEnvoyConfigRoutesThroughTheSidecarToTheDestinationHeader(t *testing.T) {
	data, err := os.ReadFile(envoyConfig)
	require.NoError(t, err)
	b := loadBootstrap(t, data)

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	var inference *listenerv3.Listener
	for _, l := range b.GetStaticResources().GetListeners() {
		if l.GetName() == "inference" {
			inference = l
		}
	}
	require.NotNil(t, inference, "a listener named inference")
	require.Len(t, inference.GetFilterChains(), 1)
	filters := inference.GetFilterChains()[0].GetFilters()
	require.Len(t, filters, 1)
	hcm := unpack(t, filters[0].GetTypedConfig(), &hcmv3.HttpConnectionManager{})

	var extProc *extprocv3.ExternalProcessor
	t.Run("the ext_proc filter sends request headers and streams bodies full duplex to the sidecar", func(t *testing.T) {
		httpFilters := hcm.GetHttpFilters()
		require.GreaterOrEqual(t, len(httpFilters), 2)
		assert.Equal(t, "envoy.filters.http.ext_proc", httpFilters[0].GetName(), "ext_proc decides the destination before anything routes")
		extProc = unpack(t, httpFilters[0].GetTypedConfig(), &extprocv3.ExternalProcessor{})
		last := httpFilters[len(httpFilters)-1]
		unpack(t, last.GetTypedConfig(), &routerv3.Router{})

		mode := extProc.GetProcessingMode()
		assert.Equal(t, extprocv3.ProcessingMode_SEND, mode.GetRequestHeaderMode())
		assert.Equal(t, extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED, mode.GetRequestBodyMode())
		assert.Equal(t, extprocv3.ProcessingMode_SEND, mode.GetRequestTrailerMode(), "Envoy requires SEND trailers with a FULL_DUPLEX_STREAMED body")
		if mode.GetResponseBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			assert.Equal(t, extprocv3.ProcessingMode_SEND, mode.GetResponseTrailerMode(), "Envoy requires SEND trailers with a FULL_DUPLEX_STREAMED body")
		}
		assert.False(t, extProc.GetFailureModeAllow(), "the sidecar applies each pool's failure mode")
	})

	t.Run("the sidecar is reached over HTTP/2 on its ext_proc port", func(t *testing.T) {
		require.NotNil(t, extProc)
		name := extProc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		sidecar := clusters[name]
		require.NotNil(t, sidecar, "the ext_proc filter's cluster %q is defined", name)
		opts := sidecar.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		require.NotNil(t, opts, "gRPC needs HTTP/2 protocol options")
		assert.NotNil(t, unpack(t, opts, &httpv3.HttpProtocolOptions{}).GetExplicitHttpConfig().GetHttp2ProtocolOptions())
		eps := sidecar.GetLoadAssignment().GetEndpoints()
		require.Len(t, eps, 1)
		require.Len(t, eps[0].GetLbEndpoints(), 1)
		addr := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		assert.Equal(t, "127.0.0.1", addr.GetAddress(), "the sidecar runs in the gateway's pod")
		assert.EqualValues(t, sidecarGRPCPort, addr.GetPortValue())
	})

	t.Run("every route goes to an ORIGINAL_DST cluster on x-gateway-destination-endpoint", func(t *testing.T) {
		hosts := hcm.GetRouteConfig().GetVirtualHosts()
		require.NotEmpty(t, hosts)
		for _, vh := range hosts {
			for _, r := range vh.GetRoutes() {
				name := r.GetRoute().GetCluster()
				c := clusters[name]
				require.NotNil(t, c, "route %s goes to a defined cluster, not %q", r.GetMatch(), name)
				assert.Equal(t, clusterv3.Cluster_ORIGINAL_DST, c.GetType(), "cluster %s", name)
				assert.Equal(t, clusterv3.Cluster_CLUSTER_PROVIDED, c.GetLbPolicy(), "cluster %s", name)
				assert.True(t, c.GetOriginalDstLbConfig().GetUseHttpHeader(), "cluster %s", name)
				assert.Equal(t, destinationHdr, c.GetOriginalDstLbConfig().GetHttpHeaderName(), "cluster %s", name)
			}
		}
	})
}

func TestEnvoyConfigMapCarriesTheExampleConfigUnchanged(t *testing.T) {
	data, err := os.ReadFile(envoyConfigMap)
	require.NoError(t, err)
	var cm corev1.ConfigMap
	require.NoError(t, yaml.UnmarshalStrict(data, &cm))
	want, err := os.ReadFile(envoyConfig)
	require.NoError(t, err)
	assert.Equal(t, string(want), cm.Data["envoy.yaml"],
		"%s differs from %s; regenerate its data with: sed 's/^/    /; s/^    $//' %s", filepath.Base(envoyConfigMap), envoyConfig, envoyConfig)
}

func TestAnInvalidEnvoyConfigIsCaught(t *testing.T) {
	tests := []struct {
		name   string
		config string
	}{
		{name: "an unknown field", config: "static_resources: {clusterz: []}"},
		{name: "a misspelled processing mode", config: "static_resources: {listeners: [{name: l, filter_chains: [{filters: [{name: h, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, http_filters: [{name: e, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor, processing_mode: {request_body_mode: FULL_DUPLEX}}}]}}]}]}]}"},
		{name: "an unknown typed_config type", config: "static_resources: {listeners: [{name: l, filter_chains: [{filters: [{name: h, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.network.nope.v3.Nope}}]}]}]}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, err := yaml.YAMLToJSON([]byte(tt.config))
			require.NoError(t, err)
			assert.Error(t, protojson.Unmarshal(js, &bootstrapv3.Bootstrap{}))
		})
	}
}

func TestSidecarDeploymentRunsEnvoyWithTheConfigAndTheSidecarWithValidFlags(t *testing.T) {
	data, err := os.ReadFile(sidecarDeployment)
	require.NoError(t, err)
	var d appsv1.Deployment
	require.NoError(t, yaml.UnmarshalStrict(data, &d))
	spec := d.Spec.Template.Spec

	var sidecar, envoy *corev1.Container
	for i, c := range spec.InitContainers {
		if c.Name == "mci-sidecar" {
			sidecar = &spec.InitContainers[i]
		}
	}
	for i, c := range spec.Containers {
		if c.Name == "envoy" {
			envoy = &spec.Containers[i]
		}
	}
	require.NotNil(t, sidecar, "mci-sidecar is an init container")
	require.NotNil(t, envoy)

	t.Run("mci-sidecar is a native sidecar that accepts its flags", func(t *testing.T) {
		require.NotNil(t, sidecar.RestartPolicy)
		assert.Equal(t, corev1.ContainerRestartPolicyAlways, *sidecar.RestartPolicy, "it runs beside Envoy, started before and stopped after it")
		o := app.NewOptions()
		cmd := app.NewCommand(o)
		require.NoError(t, cmd.ParseFlags(sidecar.Args))
		require.NoError(t, o.Validate())
		assert.Equal(t, sidecarGRPCPort, o.GRPCPort, "Envoy's ext_proc cluster calls 127.0.0.1:%d", sidecarGRPCPort)
		assert.Contains(t, sidecar.Ports, corev1.ContainerPort{Name: "grpc-ext-proc", ContainerPort: int32(sidecarGRPCPort)})
	})

	t.Run("Envoy runs the ConfigMap's configuration", func(t *testing.T) {
		cmData, err := os.ReadFile(envoyConfigMap)
		require.NoError(t, err)
		var cm corev1.ConfigMap
		require.NoError(t, yaml.UnmarshalStrict(cmData, &cm))
		var mountPath string
		for _, m := range envoy.VolumeMounts {
			for _, v := range spec.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
					mountPath = m.MountPath
				}
			}
		}
		require.NotEmpty(t, mountPath, "the ConfigMap %s is mounted in the envoy container", cm.Name)
		assert.Contains(t, envoy.Args, filepath.Join(mountPath, "envoy.yaml"))
		assert.Equal(t, d.Namespace, cm.Namespace)
	})
}
