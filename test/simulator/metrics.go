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
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.Metrics()
	model := c.s.opts.Model
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(m.Waiting), model)
	ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(m.Running), model)
	ch <- prometheus.MustNewConstMetric(kvCacheDesc, prometheus.GaugeValue, m.KVCacheUsage, model)
	// vLLM exposes lora_requests_info only when LoRA is enabled (here: or
	// adapters are pinned); its value is the time of the observation.
	if pins := c.s.Pins(); m.MaxLoRA > 0 || pins.RunningAdapters != nil || pins.WaitingAdapters != nil {
		ch <- prometheus.MustNewConstMetric(loraInfoDesc, prometheus.GaugeValue,
			float64(time.Now().UnixNano())/1e9,
			strings.Join(m.RunningAdapters, ","), strings.Join(m.WaitingAdapters, ","), strconv.Itoa(m.MaxLoRA))
	}
}
