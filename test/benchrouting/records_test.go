package benchrouting

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// recordsDirEnv names the directory where each run's per-request records
// go (none when unset): a tail in the tables (a p99, requests sent to a
// filled cluster) is a handful of requests, and which ones, sent where
// and when, is what tells a routing's fault from the run's luck.
const recordsDirEnv = "MCI_BENCH_ROUTING_RECORDS"

// record is one request of a run as recordsDirEnv's files hold it, one
// JSON object a line in the order of the workload.
type record struct {
	Index int `json:"i"`
	// AtMS is when it was sent, from the start of the run.
	AtMS float64 `json:"at_ms"`
	// Group and Conversation are -1 for a one-shot request.
	Group        int     `json:"group"`
	Conversation int     `json:"conversation"`
	Turn         int     `json:"turn"`
	Cluster      string  `json:"cluster"`
	Code         int     `json:"code"`
	Complete     bool    `json:"complete"`
	TTFTMS       float64 `json:"ttft_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	// AfterSaturation: counted in "sent to the saturated cluster after
	// it filled".
	AfterSaturation bool `json:"after_saturation,omitempty"`
}

// writeRecords writes run's records of reqs to dir/name.jsonl; nothing
// when dir is "".
func writeRecords(dir, name string, reqs []workload.Request, run *runResult) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, name+".jsonl"))
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for i, r := range reqs {
		o := run.outcomes[i]
		err := enc.Encode(record{Index: r.Index, AtMS: ms(r.At), Group: r.Group, Conversation: r.Conversation, Turn: r.Turn,
			Cluster: o.cluster, Code: o.code, Complete: o.complete, TTFTMS: ms(o.ttft), E2EMS: ms(o.e2e),
			PromptTokens: o.promptTokens, CachedTokens: o.cachedTokens, AfterSaturation: o.afterSaturation})
		if err != nil {
			_ = f.Close()
			return err
		}
	}
	return f.Close()
}
