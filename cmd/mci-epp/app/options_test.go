package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/epp"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		set     func(*Options)
		wantErr string
	}{
		{name: "standalone with endpoints is valid", set: func(o *Options) { o.Endpoints = []string{"127.0.0.1:8000"} }},
		{name: "Kubernetes mode with a pool name is valid", set: func(o *Options) { o.PoolName = "pool" }},
		{name: "neither endpoints nor a pool name", set: func(*Options) {}, wantErr: "either --endpoints (standalone mode) or --pool-name (Kubernetes mode) is required"},
		{name: "a model config in Kubernetes mode", set: func(o *Options) { o.PoolName, o.ModelConfig = "pool", "models.yaml" }, wantErr: "--model-config is for the standalone mode"},
		{name: "a kubeconfig in standalone mode", set: func(o *Options) { o.Endpoints, o.Kubeconfig = []string{"127.0.0.1:8000"}, "kc" }, wantErr: "--kubeconfig is for the Kubernetes mode"},
		{name: "a port out of range", set: func(o *Options) { o.PoolName, o.GRPCPort = "pool", 70000 }, wantErr: "--grpc-port 70000 is not a port"},
		{name: "metrics auth in Kubernetes mode asks the cluster", set: func(o *Options) { o.PoolName, o.MetricsEndpointAuth = "pool", true }},
		{name: "metrics auth in standalone mode needs a token file", set: func(o *Options) { o.Endpoints, o.MetricsEndpointAuth = []string{"127.0.0.1:8000"}, true }, wantErr: "needs --metrics-token-file"},
		{name: "metrics auth in standalone mode with a token file is valid", set: func(o *Options) {
			o.Endpoints, o.MetricsEndpointAuth, o.MetricsTokenFile = []string{"127.0.0.1:8000"}, true, "tokens.csv"
		}},
		{name: "a token file without metrics auth", set: func(o *Options) { o.PoolName, o.MetricsTokenFile = "pool", "tokens.csv" }, wantErr: "--metrics-token-file needs --metrics-endpoint-auth"},
		{name: "llm-d pool metric names", set: func(o *Options) { o.PoolName, o.PoolMetricsNames = "pool", "llm_d_epp" }},
		{name: "both pool metric names", set: func(o *Options) { o.PoolName, o.PoolMetricsNames = "pool", "both" }},
		{name: "unknown pool metric names", set: func(o *Options) { o.PoolName, o.PoolMetricsNames = "pool", "vllm" }, wantErr: `--pool-metrics-names "vllm"`},
		{name: "model servers from EndpointSlices of a Service", set: func(o *Options) {
			o.PoolName, o.ModelServerDiscovery, o.ModelServerService, o.ModelServerAddress = "pool", "endpointslices", "servers", "pod-ip"
		}},
		{name: "model servers from EndpointSlices without a Service", set: func(o *Options) { o.PoolName, o.ModelServerDiscovery = "pool", "endpointslices" }, wantErr: "needs --model-server-service"},
		{name: "a Service for model servers from Pods", set: func(o *Options) { o.PoolName, o.ModelServerService = "pool", "servers" }, wantErr: "--model-server-service is for --model-server-discovery=endpointslices"},
		{name: "pod addresses for model servers from Pods", set: func(o *Options) { o.PoolName, o.ModelServerAddress = "pool", "pod-ip" }, wantErr: "--model-server-address=pod-ip is for"},
		{name: "an unknown model server source", set: func(o *Options) { o.PoolName, o.ModelServerDiscovery = "pool", "dns" }, wantErr: `--model-server-discovery "dns"`},
		{name: "an unknown model server address", set: func(o *Options) {
			o.PoolName, o.ModelServerDiscovery, o.ModelServerService, o.ModelServerAddress = "pool", "endpointslices", "servers", "node"
		}, wantErr: `--model-server-address "node"`},
		{name: "a metadata refresh of zero", set: func(o *Options) { o.PoolName, o.MetadataRefresh = "pool", 0 }, wantErr: "--model-server-metadata-refresh must be positive"},
		{name: "a KV cache threshold above 1", set: func(o *Options) { o.PoolName, o.Scheduling.SheddableKVCacheThreshold = "pool", 80 }, wantErr: "not between 0 and 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			tt.set(o)
			err := o.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestStandaloneSource(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	good := write("good.yaml", `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModel
metadata:
  name: llama2
spec:
  modelName: llama2
  criticality: Critical
  poolRef:
    name: pool
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata:
  name: batch
spec:
  priority: -1
  poolRef:
    name: pool
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: canary
spec:
  poolRef:
    name: pool
  rules:
  - matches:
    - model: {value: llama2}
    targets:
    - modelRewrite: llama2-v2
`)
	bad := write("bad.yaml", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\nmetadata: {name: x}\nspec:\n  modelName: [\n")

	t.Run("endpoints, models, objectives and rewrites are read", func(t *testing.T) {
		o := NewOptions()
		o.Endpoints, o.ModelConfig = []string{"127.0.0.1:8000", "127.0.0.2:8000"}, good
		src, err := o.Source()
		require.NoError(t, err)
		static := src.(epp.StaticSource)
		assert.Len(t, static.Endpoints, 2)
		require.Len(t, static.Config.Models, 1)
		assert.Equal(t, "llama2", static.Config.Models[0].Spec.ModelName)
		require.Len(t, static.Config.Objectives, 1)
		assert.Equal(t, "llm-d.ai/v1alpha2", static.Config.Objectives[0].APIVersion)
		require.Len(t, static.Config.Rewrites, 1)
		assert.Equal(t, "canary", static.Config.Rewrites[0].Name)
	})
	t.Run("bad YAML is a startup error naming the file and the document", func(t *testing.T) {
		o := NewOptions()
		o.Endpoints, o.ModelConfig = []string{"127.0.0.1:8000"}, bad
		_, err := o.Source()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--model-config "+bad+": document 1")
	})
	t.Run("a bad InferenceObjective is a startup error naming it", func(t *testing.T) {
		o := NewOptions()
		o.Endpoints = []string{"127.0.0.1:8000"}
		o.ModelConfig = write("bad-objective.yaml", "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: batch}\nspec:\n  priority: low\n  poolRef: {name: pool}\n")
		_, err := o.Source()
		require.Error(t, err)
		assert.Contains(t, err.Error(), `document 1 (InferenceObjective "batch")`)
	})
	t.Run("a missing model config file is a startup error", func(t *testing.T) {
		o := NewOptions()
		o.Endpoints, o.ModelConfig = []string{"127.0.0.1:8000"}, filepath.Join(dir, "missing.yaml")
		_, err := o.Source()
		assert.ErrorContains(t, err, "--model-config")
	})
	t.Run("an endpoint that is not ip:port is a startup error", func(t *testing.T) {
		o := NewOptions()
		o.Endpoints = []string{"model-server:8000"}
		_, err := o.Source()
		assert.ErrorContains(t, err, `"model-server" is not an IP address`)
	})
}
