package main

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/simulator"
)

func TestParseFlags(t *testing.T) {
	ten, half := 10, 0.3
	tests := []struct {
		name    string
		args    []string
		want    simulator.Options
		listen  string
		wantErr bool
	}{
		{
			name:   "defaults",
			args:   []string{"--model=m"},
			want:   simulator.Options{Model: "m", Latency: simulator.DefaultLatency, Concurrency: simulator.DefaultConcurrency, LoRAAdapters: []string{}},
			listen: "127.0.1.1:8000",
		},
		{
			name: "seed 001's pod A",
			args: []string{"--model=m", "--listen=127.0.1.2:8000", "--lora-adapters=lora-x, lora-y", "--max-lora=2", "--pin-waiting=10", "--pin-kv-cache=0.3", "--pin-running-adapters=lora-x", "--instance-id=pod-a", "--latency=1ms", "--concurrency=4", "--not-ready"},
			want: simulator.Options{
				Model: "m", InstanceID: "pod-a", LoRAAdapters: []string{"lora-x", "lora-y"}, MaxLoRA: 2,
				Latency: time.Millisecond, Concurrency: 4, NotReady: true,
				Pins: simulator.Pins{Waiting: &ten, KVCacheUsage: &half, RunningAdapters: []string{"lora-x"}},
			},
			listen: "127.0.1.2:8000",
		},
		{
			name:   "--max-num-seqs sets the batch size, as vLLM's flag does",
			args:   []string{"--model=m", "--max-num-seqs=3"},
			want:   simulator.Options{Model: "m", Latency: simulator.DefaultLatency, Concurrency: 3, LoRAAdapters: []string{}},
			listen: "127.0.1.1:8000",
		},
		{
			name: "an adapter pin given empty pins none",
			args: []string{"--model=m", "--pin-waiting-adapters="},
			want: simulator.Options{Model: "m", Latency: simulator.DefaultLatency, Concurrency: simulator.DefaultConcurrency, LoRAAdapters: []string{},
				Pins: simulator.Pins{WaitingAdapters: []string{}}},
			listen: "127.0.1.1:8000",
		},
		{
			name: "a cost model flag enables the cost model",
			args: []string{"--model=m", "--prefill-per-token=100us", "--round-trip=3ms"},
			want: simulator.Options{Model: "m", Latency: simulator.DefaultLatency, Concurrency: simulator.DefaultConcurrency, LoRAAdapters: []string{},
				CostModel: &simulator.CostModel{BlockTokens: simulator.DefaultBlockTokens, CacheBlocks: simulator.DefaultCacheBlocks,
					OutputTokens: simulator.DefaultOutputTokens, StreamChunkTokens: simulator.DefaultStreamChunkTokens,
					PrefillPerToken: 100 * time.Microsecond, RoundTrip: 3 * time.Millisecond}},
			listen: "127.0.1.1:8000",
		},
		{
			name:   "--cost-model=false leaves it off",
			args:   []string{"--model=m", "--cost-model=false"},
			want:   simulator.Options{Model: "m", Latency: simulator.DefaultLatency, Concurrency: simulator.DefaultConcurrency, LoRAAdapters: []string{}},
			listen: "127.0.1.1:8000",
		},
		{name: "no model", args: []string{}, wantErr: true},
		{name: "a stray argument", args: []string{"--model=m", "extra"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, listen, err := parseFlags(tt.args)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, opts)
			assert.Equal(t, tt.listen, listen)
		})
	}
}

// TestSIGTERMShutsDownGracefully runs the built command: a request in
// flight when SIGTERM arrives is answered, then the process exits 0.
func TestSIGTERMShutsDownGracefully(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	bin := filepath.Join(t.TempDir(), "simulator")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	ports, err := localclusterset.FreePorts(1)
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))

	cmd := exec.Command(bin, "--listen="+addr, "--model=m", "--instance-id=sim-term")
	var logs strings.Builder
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Killing a process that has exited is a harmless error.
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	url := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "the simulator did not start: %s", &logs)

	answered := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set(simulator.LatencyHeader, "700ms")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		answered <- resp
	}()
	// SIGTERM once the request is in the batch.
	require.Eventually(t, func() bool {
		m, err := promtext.Get(t.Context(), url+"/metrics")
		if err != nil {
			return false
		}
		running, _, err := m.Lookup(`vllm:num_requests_running{model_name="m"}`)
		return err == nil && running == 1
	}, 10*time.Second, 10*time.Millisecond, "the request never ran: %s", &logs)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))

	resp := <-answered
	require.NotNil(t, resp, "the request in flight failed: %s", &logs)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "sim-term", resp.Header.Get(simulator.InstanceHeader))
	select {
	case err := <-exited:
		assert.NoError(t, err, "%s", &logs)
	case <-time.After(10 * time.Second):
		t.Fatalf("the simulator did not exit after SIGTERM: %s", &logs)
	}
}
