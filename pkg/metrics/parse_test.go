package metrics

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/scheduling"
)

func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return string(b)
}

func adapters(names ...string) sets.Set[string] { return sets.New(names...) }

const waitingAndKV = `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
`

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		text string
		want scheduling.Metrics
	}{
		{
			name: "a vLLM V1 server's exposition gives its queue, KV cache usage and the newest LoRA info",
			text: readFixture(t, "vllm-v1.txt"),
			want: scheduling.Metrics{
				WaitingQueue:    7,
				KVCacheUsage:    0.4235,
				RunningRequests: 12,
				RunningKnown:    true,
				ActiveAdapters:  adapters("sql-lora", "tweet-summary"),
				WaitingAdapters: adapters("sql-lora-v2"),
				MaxLoRA:         4,
			},
		},
		{
			name: "an older vLLM server without kv_cache_usage_perc reports gpu_cache_usage_perc and no adapters",
			text: readFixture(t, "vllm-v0-legacy.txt"),
			want: scheduling.Metrics{
				WaitingQueue:    54,
				KVCacheUsage:    0.91,
				RunningRequests: 3,
				RunningKnown:    true,
				ActiveAdapters:  adapters(),
				WaitingAdapters: adapters(),
			},
		},
		{
			name: "kv_cache_usage_perc wins over gpu_cache_usage_perc when a server has both",
			text: waitingAndKV + `vllm:gpu_cache_usage_perc{model_name="m"} 0.9` + "\n",
			want: scheduling.Metrics{WaitingQueue: 2, KVCacheUsage: 0.5, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "the newest lora_requests_info series wins wherever it appears",
			text: waitingAndKV + `# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{max_lora="3",running_lora_adapters="new",waiting_lora_adapters="next"} 1.9e+09
vllm:lora_requests_info{max_lora="1",running_lora_adapters="older",waiting_lora_adapters=""} 1.6e+09
`,
			want: scheduling.Metrics{
				WaitingQueue: 2, KVCacheUsage: 0.5,
				ActiveAdapters: adapters("new"), WaitingAdapters: adapters("next"), MaxLoRA: 3,
			},
		},
		{
			name: "adapter lists tolerate spaces and empty entries",
			text: waitingAndKV + `vllm:lora_requests_info{max_lora="8",running_lora_adapters=" a, b ,,c,",waiting_lora_adapters=","} 1` + "\n",
			want: scheduling.Metrics{
				WaitingQueue: 2, KVCacheUsage: 0.5,
				ActiveAdapters: adapters("a", "b", "c"), WaitingAdapters: adapters(), MaxLoRA: 8,
			},
		},
		{
			name: "an empty max_lora label means no adapter slots",
			text: waitingAndKV + `vllm:lora_requests_info{max_lora="",running_lora_adapters="",waiting_lora_adapters=""} 1` + "\n",
			want: scheduling.Metrics{WaitingQueue: 2, KVCacheUsage: 0.5, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "queues of several engines add up and the fullest KV cache counts",
			text: `vllm:num_requests_waiting{engine="0",model_name="m"} 3
vllm:num_requests_waiting{engine="1",model_name="m"} 4
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
`,
			want: scheduling.Metrics{WaitingQueue: 7, KVCacheUsage: 0.7, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "running requests of several engines add up",
			text: waitingAndKV + "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\nvllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\n",
			want: scheduling.Metrics{WaitingQueue: 2, KVCacheUsage: 0.5, RunningRequests: 5, RunningKnown: true, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "metrics without HELP or TYPE lines are read as untyped",
			text: "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.25\n",
			want: scheduling.Metrics{WaitingQueue: 1, KVCacheUsage: 0.25, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "metric names quoted in braces are read",
			text: "{\"vllm:num_requests_waiting\",model_name=\"m\"} 6\n{\"vllm:kv_cache_usage_perc\"} 0.125\n",
			want: scheduling.Metrics{WaitingQueue: 6, KVCacheUsage: 0.125, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "a malformed line of a metric Parse does not read does not hide the load",
			text: "python_info{implementation=\"CPython\" 1.0\n# TYPE vllm:broken histogram\nvllm:broken_bucket{le=} x\n" + waitingAndKV,
			want: scheduling.Metrics{WaitingQueue: 2, KVCacheUsage: 0.5, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "indented lines, blank lines and comments are fine",
			text: "\n# a comment\n  vllm:num_requests_waiting 4\n\n\tvllm:kv_cache_usage_perc 0.75\n",
			want: scheduling.Metrics{WaitingQueue: 4, KVCacheUsage: 0.75, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "a KV cache usage above 1 reads as full",
			text: "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.0000001\n",
			want: scheduling.Metrics{KVCacheUsage: 1, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
		{
			name: "sample timestamps and an OpenMetrics EOF marker are accepted",
			text: "vllm:num_requests_waiting 2 1743500000000\nvllm:kv_cache_usage_perc 0.5 1743500000000\n# EOF\n",
			want: scheduling.Metrics{WaitingQueue: 2, KVCacheUsage: 0.5, ActiveAdapters: adapters(), WaitingAdapters: adapters()},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.text))
			require.NoError(t, err)
			assert.Equal(t, &tt.want, got)
		})
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name string
		text string
		// wantIs, if set, is the sentinel the error wraps.
		wantIs error
		// wantMsg is part of the message.
		wantMsg string
	}{
		{name: "empty input is missing the waiting queue", text: "", wantIs: ErrMissingMetric, wantMsg: WaitingQueueMetric},
		{
			name:   "a server without vLLM metrics is missing the waiting queue",
			text:   "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 5.2e+09\n",
			wantIs: ErrMissingMetric, wantMsg: WaitingQueueMetric,
		},
		{name: "a server without any KV cache metric is rejected", text: "vllm:num_requests_waiting 1\n", wantIs: ErrMissingMetric, wantMsg: KVCacheUsageMetric},
		{name: "prose has no vLLM metrics", text: "this is not prometheus\n", wantIs: ErrMissingMetric, wantMsg: WaitingQueueMetric},
		{name: "an HTML error page is not an exposition", text: "<html><body>502 Bad Gateway</body></html>\n", wantMsg: "parsing metrics"},
		{name: "a line cut short is an error", text: `vllm:num_requests_waiting{model_name="m"`, wantMsg: "parsing metrics"},
		{name: "empty braces after a HELP line are an error, not a parser panic", text: "# HELP vllm:num_requests_waiting help\n{}", wantMsg: "malformed exposition"},
		{
			name:    "a waiting queue typed as a summary is rejected",
			text:    "# TYPE vllm:num_requests_waiting summary\nvllm:num_requests_waiting{quantile=\"0.5\"} 1\nvllm:kv_cache_usage_perc 0.1\n",
			wantMsg: "no single value",
		},
		{name: "binary data is an error", text: "\x00\x01\x02\xff\xfe", wantMsg: "parsing metrics"},
		{name: "a NaN queue is rejected", text: "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0.1\n", wantMsg: "not a queue length"},
		{name: "a negative queue is rejected", text: "vllm:num_requests_waiting -1\nvllm:kv_cache_usage_perc 0.1\n", wantMsg: "not a queue length"},
		{name: "an infinite queue is rejected", text: "vllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc 0.1\n", wantMsg: "not a queue length"},
		{name: "a NaN KV cache usage is rejected", text: "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc NaN\n", wantMsg: "not a KV cache usage"},
		{name: "negative running requests are rejected", text: waitingAndKV + "vllm:num_requests_running -1\n", wantMsg: "not a count of requests"},
		{name: "NaN running requests are rejected", text: waitingAndKV + "vllm:num_requests_running NaN\n", wantMsg: "not a count of requests"},
		{name: "a negative KV cache usage is rejected", text: "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc -0.5\n", wantMsg: "not a KV cache usage"},
		{
			name:    "a max_lora that is not a number is rejected",
			text:    waitingAndKV + `vllm:lora_requests_info{max_lora="four"} 1` + "\n",
			wantMsg: `max_lora="four"`,
		},
		{
			name:    "a negative max_lora is rejected",
			text:    waitingAndKV + `vllm:lora_requests_info{max_lora="-1"} 1` + "\n",
			wantMsg: `max_lora="-1"`,
		},
		{
			name: "a waiting queue typed as a histogram has no waiting queue value",
			text: `# TYPE vllm:num_requests_waiting histogram
vllm:num_requests_waiting_bucket{le="+Inf"} 1
vllm:num_requests_waiting_count 1
vllm:num_requests_waiting_sum 1
vllm:kv_cache_usage_perc 0.1
`,
			wantIs:  ErrMissingMetric,
			wantMsg: WaitingQueueMetric,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.text))
			require.Error(t, err)
			assert.Nil(t, got)
			if tt.wantIs != nil {
				assert.ErrorIs(t, err, tt.wantIs)
			}
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm-v1.txt", "vllm-v0-legacy.txt"} {
		f.Add([]byte(readFixture(f, name)))
	}
	for _, s := range []string{
		"",
		waitingAndKV,
		waitingAndKV + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1` + "\n",
		"{\"vllm:num_requests_waiting\"} 1\n",
		"# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"1\"} 1\n",
		"vllm:num_requests_waiting 1e308\nvllm:kv_cache_usage_perc 1e-308\n",
		waitingAndKV + "vllm:num_requests_running{engine=\"0\"} 1e308\nvllm:num_requests_running{engine=\"1\"} 1e308\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := Parse(bytes.NewReader(in))
		if err != nil {
			require.Nil(t, m)
			return
		}
		// Whatever the input, accepted metrics are usable by the scheduler.
		require.NotNil(t, m)
		assert.GreaterOrEqual(t, m.WaitingQueue, 0)
		assert.True(t, m.KVCacheUsage >= 0 && m.KVCacheUsage <= 1, "KV cache usage %v", m.KVCacheUsage)
		assert.GreaterOrEqual(t, m.MaxLoRA, 0)
		assert.GreaterOrEqual(t, m.RunningRequests, 0)
		assert.True(t, m.RunningKnown || m.RunningRequests == 0)
		assert.NotNil(t, m.ActiveAdapters)
		assert.NotNil(t, m.WaitingAdapters)
	})
}
