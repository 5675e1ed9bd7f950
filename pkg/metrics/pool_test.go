package metrics

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llmdPool is a pool's gauges as the llm-d router's EPP serves them: the
// llm_d_epp names with their "[ALPHA]" help, and the deprecated
// inference_pool aliases when dual is set.
func llmdPool(pool string, queue, kv, ready string, dual bool) string {
	var b strings.Builder
	b.WriteString("# HELP llm_d_epp_average_kv_cache_utilization [ALPHA] The average kv cache utilization for an inference server pool.\n")
	b.WriteString("# TYPE llm_d_epp_average_kv_cache_utilization gauge\n")
	b.WriteString(`llm_d_epp_average_kv_cache_utilization{name="` + pool + `"} ` + kv + "\n")
	b.WriteString("# HELP llm_d_epp_average_queue_size [ALPHA] The average number of requests pending in the model server queue.\n")
	b.WriteString("# TYPE llm_d_epp_average_queue_size gauge\n")
	b.WriteString(`llm_d_epp_average_queue_size{name="` + pool + `"} ` + queue + "\n")
	b.WriteString("# TYPE llm_d_epp_ready_endpoints gauge\n")
	b.WriteString(`llm_d_epp_ready_endpoints{name="` + pool + `"} ` + ready + "\n")
	if dual {
		b.WriteString(`inference_pool_average_kv_cache_utilization{name="` + pool + `"} ` + kv + "\n")
		b.WriteString(`inference_pool_average_queue_size{name="` + pool + `"} ` + queue + "\n")
		b.WriteString(`inference_pool_ready_pods{name="` + pool + `"} ` + ready + "\n")
	}
	return b.String()
}

const giePool = `# HELP inference_pool_average_queue_size [ALPHA] The average number of requests pending in the model server queue.
# TYPE inference_pool_average_queue_size gauge
inference_pool_average_queue_size{name="llm"} 4.5
# HELP inference_pool_average_kv_cache_utilization [ALPHA] The average kv cache utilization for an inference server pool.
# TYPE inference_pool_average_kv_cache_utilization gauge
inference_pool_average_kv_cache_utilization{name="llm"} 0.25
# TYPE inference_pool_ready_pods gauge
inference_pool_ready_pods{name="llm"} 3
# TYPE go_goroutines gauge
go_goroutines 12
# TYPE inference_objective_request_duration_seconds histogram
inference_objective_request_duration_seconds_bucket{le="+Inf",model_name="m",target_model_name="m"} 1
this line is garbage of another metric
`

// manyRelayers is n series of RelayedRequestsMetric for pool llm, each of
// its own relaying cluster.
func manyRelayers(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s{name=\"llm\",relayed_from=\"cluster-%d\"} 1\n", RelayedRequestsMetric, i)
	}
	return b.String()
}

func TestParsePool(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    map[string]*PoolMetrics
		wantErr string
	}{
		{
			name: "the GIE names of one pool, among other metrics and garbage",
			text: giePool,
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 4.5, AverageKVCache: 0.25, ReadyPods: 3, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "inference_pool"}},
		},
		{
			name: "the llm-d names of one pool",
			text: llmdPool("llm", "2", "0.5", "4", false),
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 2, AverageKVCache: 0.5, ReadyPods: 4, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "llm_d_epp"}},
		},
		{
			name: "llm-d's dual emission reads as one pool, under the first scheme",
			text: llmdPool("llm", "2", "0.5", "4", true),
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 2, AverageKVCache: 0.5, ReadyPods: 4, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "inference_pool"}},
		},
		{
			name: "the llm_d_router_epp names of older llm-d releases",
			text: "llm_d_router_epp_average_queue_size{name=\"llm\"} 1\nllm_d_router_epp_average_kv_cache_utilization{name=\"llm\"} 0.1\n",
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 1, AverageKVCache: 0.1, ReadyPods: -1, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "llm_d_router_epp"}},
		},
		{
			name: "pools under different schemes on one page",
			text: "inference_pool_average_queue_size{name=\"a\"} 1\ninference_pool_average_kv_cache_utilization{name=\"a\"} 0.1\n" + llmdPool("b", "7", "0.9", "0", false),
			want: map[string]*PoolMetrics{
				"a": {AverageQueue: 1, AverageKVCache: 0.1, ReadyPods: -1, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "inference_pool"},
				"b": {AverageQueue: 7, AverageKVCache: 0.9, ReadyPods: 0, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "llm_d_epp"},
			},
		},
		{
			name:    "names of two schemes are not mixed for one pool",
			text:    "inference_pool_average_queue_size{name=\"a\"} 1\nllm_d_epp_average_kv_cache_utilization{name=\"a\"} 0.1\n",
			wantErr: "no pool gauges",
		},
		{
			name: "a series without a pool name is pool \"\"",
			text: "inference_pool_average_queue_size 1\ninference_pool_average_kv_cache_utilization 0.1\n",
			want: map[string]*PoolMetrics{"": {AverageQueue: 1, AverageKVCache: 0.1, ReadyPods: -1, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "inference_pool"}},
		},
		{
			name: "a KV cache utilization above 1 reads as full",
			text: llmdPool("llm", "0", "80", "1", false),
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 0, AverageKVCache: 1, ReadyPods: 1, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "llm_d_epp"}},
		},
		{
			name: "running requests and batch places as mci-epp publishes them",
			text: giePool + "inference_pool_average_running_requests{name=\"llm\"} 3.5\n" + BatchCapacityMetric + "{name=\"llm\"} 4\n",
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 4.5, AverageKVCache: 0.25, ReadyPods: 3, AverageRunning: 3.5, AverageBatchCapacity: 4, Scheme: "inference_pool"}},
		},
		{
			name: "the llm-d name of running requests, without batch places (an upstream EPP)",
			text: llmdPool("llm", "2", "0.5", "4", false) + "llm_d_epp_average_running_requests{name=\"llm\"} 7\n",
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 2, AverageKVCache: 0.5, ReadyPods: 4, AverageRunning: 7, AverageBatchCapacity: -1, Scheme: "llm_d_epp"}},
		},
		{
			name: "running requests and batch places beyond any engine's are capped",
			text: giePool + "inference_pool_average_running_requests{name=\"llm\"} 1e300\n" + BatchCapacityMetric + "{name=\"llm\"} 1e300\n",
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 4.5, AverageKVCache: 0.25, ReadyPods: 3, AverageRunning: maxBatchPlaces, AverageBatchCapacity: maxBatchPlaces, Scheme: "inference_pool"}},
		},
		{
			name: "requests routed by relaying cluster, as mci-epp counts them",
			text: giePool + RelayedRequestsMetric + "{name=\"llm\",relayed_from=\"\"} 2\n" + RelayedRequestsMetric + "{name=\"llm\",relayed_from=\"cluster-b\"} 5\n" +
				RelayedRequestsMetric + "{name=\"llm\",relayed_from=\"~other\"} 1\n",
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 4.5, AverageKVCache: 0.25, ReadyPods: 3, AverageRunning: -1, AverageBatchCapacity: -1, Scheme: "inference_pool",
				RelayedRequests: map[string]float64{"": 2, "cluster-b": 5, RelayedElsewhere: 1}}},
		},
		{name: "a negative count of routed requests", text: giePool + RelayedRequestsMetric + "{name=\"llm\",relayed_from=\"x\"} -1\n", wantErr: RelayedRequestsMetric + ": value -1"},
		{name: "more relaying clusters than any mci-epp counts", text: giePool + manyRelayers(maxRelayedSeries+1), wantErr: "more than 256 relaying clusters"},
		{name: "negative running requests", text: giePool + "inference_pool_average_running_requests{name=\"llm\"} -2\n", wantErr: "inference_pool_average_running_requests: value -2"},
		{name: "NaN batch places", text: giePool + BatchCapacityMetric + "{name=\"llm\"} NaN\n", wantErr: BatchCapacityMetric + ": value NaN"},
		{name: "no pool gauges", text: "go_goroutines 12\n", wantErr: "no pool gauges"},
		{name: "an empty page", text: "", wantErr: "no pool gauges"},
		{name: "a queue without KV cache", text: `inference_pool_average_queue_size{name="a"} 1` + "\n", wantErr: "no pool gauges"},
		{name: "a malformed pool gauge", text: `inference_pool_average_queue_size{name="a" 1` + "\n", wantErr: "parsing pool metrics"},
		{name: "an HTML error page", text: "<html><body>401 Unauthorized</body></html>\n", wantErr: "parsing pool metrics"},
		{name: "a negative queue", text: llmdPool("llm", "-1", "0.5", "1", false), wantErr: "llm_d_epp_average_queue_size: value -1"},
		{name: "a NaN KV cache", text: llmdPool("llm", "1", "NaN", "1", false), wantErr: "llm_d_epp_average_kv_cache_utilization: value NaN"},
		{name: "an infinite ready count", text: llmdPool("llm", "1", "0.5", "+Inf", false), wantErr: "llm_d_epp_ready_endpoints: value +Inf"},
		{name: "a pool gauge typed histogram", text: "# TYPE inference_pool_average_queue_size histogram\ninference_pool_average_queue_size_bucket{le=\"1\"} 1\ninference_pool_average_kv_cache_utilization 0\n", wantErr: "no pool gauges"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePool(strings.NewReader(tt.text))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestBatchFull(t *testing.T) {
	pool := func(running, places float64) *PoolMetrics {
		return &PoolMetrics{AverageRunning: running, AverageBatchCapacity: places, ReadyPods: 2}
	}
	tests := []struct {
		name string
		m    *PoolMetrics
		want bool
	}{
		{name: "every place taken", m: pool(2, 2), want: true},
		{name: "a place free on one server of two", m: pool(1.5, 2)},
		{name: "no batch places published (an upstream EPP)", m: pool(2, -1)},
		{name: "no running requests published (a server without them)", m: pool(-1, 2)},
		{name: "no pool metrics", m: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.m.BatchFull())
		})
	}
}

func FuzzParsePool(f *testing.F) {
	for _, s := range []string{
		"",
		giePool,
		llmdPool("llm", "2", "0.5", "4", true),
		llmdPool("", "1e308", "1e-308", "1e300", false),
		"{\"inference_pool_average_queue_size\",name=\"a\"} 1\n{\"inference_pool_average_kv_cache_utilization\"} 1\n",
		"# HELP inference_pool_average_queue_size x\n{}\n",
		giePool + "inference_pool_average_running_requests{name=\"llm\"} 2\n" + BatchCapacityMetric + "{name=\"llm\"} 2\n",
		llmdPool("llm", "2", "0.5", "4", false) + "llm_d_epp_average_running_requests{name=\"llm\"} 1e308\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		pools, err := ParsePool(bytes.NewReader(in))
		if err != nil {
			require.Nil(t, pools)
			return
		}
		// Whatever the input, accepted metrics are usable by the policy.
		require.NotEmpty(t, pools)
		for name, m := range pools {
			require.NotNil(t, m, name)
			assert.True(t, m.AverageQueue >= 0 && !math.IsInf(m.AverageQueue, 0), "queue %v", m.AverageQueue)
			assert.True(t, m.AverageKVCache >= 0 && m.AverageKVCache <= 1, "KV cache %v", m.AverageKVCache)
			assert.GreaterOrEqual(t, m.ReadyPods, -1)
			for _, v := range []float64{m.AverageRunning, m.AverageBatchCapacity} {
				assert.True(t, v == -1 || (v >= 0 && v <= maxBatchPlaces), "running or batch places %v", v)
			}
			_ = m.BatchFull()
			assert.NotEmpty(t, m.Scheme)
		}
	})
}
