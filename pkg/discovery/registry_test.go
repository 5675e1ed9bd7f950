package discovery

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRegisterInstanceID(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	tests := []struct {
		name     string
		registry Registry
		podName  string
		want     string
	}{
		{name: "InstanceID wins", registry: Registry{InstanceID: "sim-1"}, podName: "pod-x", want: "sim-1"},
		{name: "POD_NAME names the instance", podName: "pod-x", want: "pod-x"},
		{name: "the host name is the fallback", want: host},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(PodNameEnv, tt.podName)
			h, err := tt.registry.RegisterInstance("dynamo", "decode")
			require.NoError(t, err)
			assert.Equal(t, tt.want, h.InstanceID())
			assert.Equal(t, "dynamo", h.Namespace())
			assert.Equal(t, "decode", h.Component())
		})
	}
}

func TestRegisterInstanceRequiresNamespaceAndComponent(t *testing.T) {
	for _, args := range [][2]string{{"", "decode"}, {"dynamo", ""}} {
		_, err := Registry{InstanceID: "x"}.RegisterInstance(args[0], args[1])
		assert.Error(t, err, "%q", args)
	}
}

func TestInstanceHandleServesMetadataAndReadiness(t *testing.T) {
	h, err := Registry{InstanceID: "decode-0"}.RegisterInstance("dynamo", "decode")
	require.NoError(t, err)
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	// A fresh instance is not ready and has empty metadata.
	code, body := get(ReadyPath)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "decode-0")
	md, err := Metadata(t.Context(), srv.Client(), srv.URL)
	require.NoError(t, err)
	assert.Empty(t, md)

	h.SetReady(true)
	assert.True(t, h.Ready())
	code, _ = get(ReadyPath)
	assert.Equal(t, http.StatusOK, code)

	want := map[string]any{"Model": map[string]any{"name": "Qwen3-32B", "type": "Completions"}}
	require.NoError(t, h.SetMetadata(want))
	md, err = Metadata(t.Context(), srv.Client(), srv.URL)
	require.NoError(t, err)
	assert.Equal(t, want, md, "metadata is visible as soon as it is set")

	assert.Error(t, h.SetMetadata(map[string]any{"bad": make(chan int)}), "metadata must encode as JSON")
	md, err = Metadata(t.Context(), srv.Client(), srv.URL)
	require.NoError(t, err)
	assert.Equal(t, want, md, "a failed SetMetadata keeps the previous metadata")

	h.SetReady(false)
	code, _ = get(ReadyPath)
	assert.Equal(t, http.StatusServiceUnavailable, code)

	code, _ = get("/other")
	assert.Equal(t, http.StatusNotFound, code)
	resp, err := srv.Client().Post(srv.URL+MetadataPath, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}
