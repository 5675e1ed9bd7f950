package discovery

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadata(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    map[string]any
		wantErr string
	}{
		{
			name: "a JSON object is returned",
			handler: func(w http.ResponseWriter, r *http.Request) {
				assert.Equal(t, MetadataPath, r.URL.Path)
				_, _ = w.Write([]byte(`{"Model":{"name":"Qwen3-32B","runtime_config":{"total_kv_blocks":24064}}}`))
			},
			want: map[string]any{"Model": map[string]any{"name": "Qwen3-32B", "runtime_config": map[string]any{"total_kv_blocks": 24064.0}}},
		},
		{
			name: "a status other than 200 is an error that quotes the body",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "starting up", http.StatusServiceUnavailable)
			},
			wantErr: `503 Service Unavailable: "starting up"`,
		},
		{
			name:    "a body that is not JSON is an error",
			handler: func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>hello</html>")) },
			wantErr: "not a JSON object",
		},
		{
			name:    "a JSON array is not an object",
			handler: func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`[1,2]`)) },
			wantErr: "not a JSON object",
		},
		{
			name:    "null is not an object",
			handler: func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`null`)) },
			wantErr: "not a JSON object",
		},
		{
			name:    "trailing data is an error",
			handler: func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"a":1} {"b":2}`)) },
			wantErr: "trailing data",
		},
		{
			name:    "a stray closing bracket after the object is trailing data",
			handler: func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"a":1}}`)) },
			wantErr: "trailing data",
		},
		{
			name: "a body over the limit is an error",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(`{"a":"` + strings.Repeat("x", MaxMetadataBytes) + `"}`))
			},
			wantErr: "larger than",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			got, err := Metadata(t.Context(), srv.Client(), srv.URL+"/")
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Contains(t, err.Error(), srv.URL, "the error names the instance")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestMetadataTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Metadata(ctx, nil, srv.URL)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "got %v", err)
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestMetadataUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := Metadata(t.Context(), nil, url)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "metadata of "+url)
}
