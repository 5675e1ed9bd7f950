package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/test/envoyclient"
)

// TestPromptsRoutedWithoutTheSidecarAreReportedByTheirEPP: conversations
// that began through each cluster's own gateway (straight to its EPP, which
// the importing sidecar never sees) continue through the sidecar on the
// cluster that holds their prefix, because the EPPs' prefix summaries say
// so: the canonical hashing of mci-epp (the producer) and of the sidecar
// (the consumer) agree on real chat and completions bodies. Without the
// summaries, each new prompt would be dealt by the rotation, and the 8 of
// them would all go home with a chance of 1 in 256.
func TestPromptsRoutedWithoutTheSidecarAreReportedByTheirEPP(t *testing.T) {
	msA, msC := modelServer(t, "model-a"), modelServer(t, "model-c")
	eppA, _ := runEPP(t, msA, extproc.TLSOptions{})
	eppC, _ := runEPP(t, msC, extproc.TLSOptions{})
	path := startTwoClusters(t, msA, msC, eppA, eppC, routingpolicy.PrefixAffinity, func(cfg *Config) {
		cfg.ScrapeInterval, cfg.PrefixSummaryInterval = 50*time.Millisecond, 50*time.Millisecond
	})

	type conversation struct {
		path   string
		body   func(question string) []byte
		direct *epp.EPP
		home   string
	}
	system := func(i int) string {
		return fmt.Sprintf("You are assistant %d of the fleet; answer in full sentences and cite what you read. ", i) + strings.Repeat("Be kind and be brief. ", 30)
	}
	var conversations []conversation
	for i := range 8 {
		c := conversation{direct: eppA, home: "model-a"}
		if i%2 == 1 {
			c.direct, c.home = eppC, "model-c"
		}
		if i < 4 {
			c.path = "/v1/chat/completions"
			c.body = func(q string) []byte {
				b, _ := json.Marshal(map[string]any{"model": "base", "messages": []map[string]string{{"role": "system", "content": system(i)}, {"role": "user", "content": q}}})
				return b
			}
		} else {
			c.path = "/v1/completions"
			c.body = func(q string) []byte {
				b, _ := json.Marshal(map[string]any{"model": "base", "prompt": system(i) + q, "max_tokens": 16})
				return b
			}
		}
		conversations = append(conversations, c)
	}

	// The first turns go through each cluster's own gateway.
	for _, c := range conversations {
		client, err := envoyclient.Dial(c.direct.GRPCAddr(), envoyclient.Options{})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := client.Do(ctx, envoyclient.Request{Path: c.path, Body: c.body("Hello, who are you?")})
		cancel()
		require.NoError(t, err)
		require.Nil(t, res.Immediate)
		_ = client.Close()
	}
	// Once the sidecar holds each EPP's summary of them: as the EPP builds
	// it now (it builds at most once a second, so one read a build period
	// after the last first turn holds them all)...
	firstTurnsDone := time.Now()
	require.Eventually(t, func() bool {
		if time.Since(firstTurnsDone) < epp.PrefixSummaryInterval {
			return false
		}
		for _, e := range []*epp.EPP{eppA, eppC} {
			want := publishedSummary(t, e)
			held := path.sidecar.scraper.Get("http://"+e.MetricsAddr()+"/metrics", "")
			if want == nil || want.Blocks() == 0 || held == nil || held.Prefixes == nil || held.Prefixes.Blocks() != want.Blocks() {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond)

	// ...the next turns go through the sidecar, each to the cluster that
	// served its first.
	for turn := range 3 {
		for i, c := range conversations {
			req, err := http.NewRequest(http.MethodPost, path.gateway.URL+c.path, strings.NewReader(string(c.body(fmt.Sprintf("And question %d?", turn)))))
			require.NoError(t, err)
			req.Host = "my.model.com"
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
			var out map[string]string
			require.NoError(t, json.Unmarshal(b, &out))
			assert.Equal(t, c.home, out["served_by"], "conversation %d (%s), turn %d", i, c.path, turn)
		}
	}
	_, body := get(t, "http://"+path.sidecar.MetricsAddr()+"/metrics")
	assert.Contains(t, body, `mci_sidecar_prefix_home_requests_total{backend="InferencePoolImport example/llm",result="reported"} 8`, "each conversation placed once by a report")

	// The next turns added blocks to the summaries the sidecar holds: it
	// is sent how they changed, and holds what the EPPs publish whole.
	nextTurnsDone := time.Now()
	require.Eventually(t, func() bool {
		if time.Since(nextTurnsDone) < epp.PrefixSummaryInterval {
			return false
		}
		for _, e := range []*epp.EPP{eppA, eppC} {
			want, err := publishedSummary(t, e).AppendBinary(nil)
			require.NoError(t, err)
			held := path.sidecar.scraper.Get("http://"+e.MetricsAddr()+"/metrics", "")
			if held == nil || held.Prefixes == nil {
				return false
			}
			if got, err := held.Prefixes.AppendBinary(nil); err != nil || string(got) != string(want) {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond)
	_, body = get(t, "http://"+path.sidecar.MetricsAddr()+"/metrics")
	assert.Regexp(t, `mci_sidecar_epp_prefix_summary_fetches_total\{result="delta"\} [1-9]`, body)
}

// publishedSummary is the prefix summary e serves now, nil if none.
func publishedSummary(t *testing.T, e *epp.EPP) *promptprefix.Summary {
	req, err := http.NewRequest(http.MethodGet, "http://"+e.MetricsAddr()+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", promptprefix.SummaryContentType)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	s, err := promptprefix.ParseSummary(b)
	require.NoError(t, err)
	return s
}
