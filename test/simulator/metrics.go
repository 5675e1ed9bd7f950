package simulator

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The vLLM metrics the simulator exposes, as pkg/metrics reads them.
var (
	waitingDesc = prometheus.NewDesc("vllm:num_requests_waiting",
		"Number of requests waiting to be processed.", []string{"model_name"}, nil)
	runningDesc = prometheus.NewDesc("vllm:num_requests_running",
		"Number of requests in model execution batches.", []string{"model_name"}, nil)
	kvCacheDesc = prometheus.NewDesc("vllm:kv_cache_usage_perc",
		"KV-cache usage. 1 means 100 percent usage.", []string{"model_name"}, nil)
	prefixQueriesDesc = prometheus.NewDesc("vllm:prefix_cache_queries_total",
		"Prefix cache queries, in terms of number of queried tokens.", []string{"model_name"}, nil)
	prefixHitsDesc = prometheus.NewDesc("vllm:prefix_cache_hits_total",
		"Prefix cache hits, in terms of number of cached tokens.", []string{"model_name"}, nil)
	loraInfoDesc = prometheus.NewDesc("vllm:lora_requests_info",
		"Running stats on lora requests.", []string{"running_lora_adapters", "waiting_lora_adapters", "max_lora"}, nil)
)

// collector reports a Server's load when scraped.
type collector struct{ s *Server }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- waitingDesc
	ch <- runningDesc
	ch <- kvCacheDesc
	ch <- loraInfoDesc
	ch <- prefixQueriesDesc
	ch <- prefixHitsDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.Metrics()
	model := c.s.opts.Model
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(m.Waiting), model)
	ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(m.Running), model)
	ch <- prometheus.MustNewConstMetric(kvCacheDesc, prometheus.GaugeValue, m.KVCacheUsage, model)
	if st, ok := c.s.CacheStats(); ok {
		ch <- prometheus.MustNewConstMetric(prefixQueriesDesc, prometheus.CounterValue, float64(st.QueryTokens), model)
		ch <- prometheus.MustNewConstMetric(prefixHitsDesc, prometheus.CounterValue, float64(st.HitTokens), model)
	}
	// vLLM exposes lora_requests_info only when LoRA is enabled (here: or
	// adapters are pinned); its value is the time of the observation.
	if pins := c.s.Pins(); m.MaxLoRA > 0 || pins.RunningAdapters != nil || pins.WaitingAdapters != nil {
		ch <- prometheus.MustNewConstMetric(loraInfoDesc, prometheus.GaugeValue,
			float64(time.Now().UnixNano())/1e9,
			strings.Join(m.RunningAdapters, ","), strings.Join(m.WaitingAdapters, ","), strconv.Itoa(m.MaxLoRA))
	}
}
