package epp_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/test/envoyclient"
)

// fetchSummary asks the EPP's metrics URL for its prefix summary, as an
// importing cluster's sidecar does; etag, when set, is the one it holds.
func fetchSummary(t *testing.T, metricsAddr, etag string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", promptprefix.SummaryContentType)
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := noKeepAlive.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// TestThePrefixSummaryHoldsWhatWasRoutedAsItsConsumersHashIt: real chat
// and completions bodies go through the EPP's ext_proc path; the summary it
// serves on its metrics URL holds every block of their prompts as a
// consumer hashes them from the same bodies (the request's reader and the
// model the body names), for a model the EPP rewrites too.
func TestThePrefixSummaryHoldsWhatWasRoutedAsItsConsumersHashIt(t *testing.T) {
	eps := startModelServers(t, pod("A", 0, 0.1), pod("B", 0, 0.1))
	e := startEPP(t, epp.Config{}, eps)
	system := strings.Repeat("You are the assistant of a fleet; answer in full sentences. ", 40)
	bodies := map[string][]byte{}
	for name, body := range map[string]any{
		"completions":                    map[string]any{"model": "base", "prompt": system + "Write a haiku about GPUs.", "max_tokens": 16},
		"completions, prompt array":      map[string]any{"model": "base", "prompt": []string{system, "Name three rivers."}},
		"chat":                           map[string]any{"model": "base", "messages": []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": "Hello there, who are you?"}}},
		"chat, content parts":            map[string]any{"model": "base", "messages": []map[string]any{{"role": "system", "content": []map[string]string{{"type": "text", "text": system}}}, {"role": "user", "content": "Hi."}}},
		"chat, a model the EPP rewrites": map[string]any{"model": "batch", "messages": []map[string]any{{"role": "system", "content": system + "Be brief."}, {"role": "user", "content": "What is a GPU?"}}},
	} {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		bodies[name] = raw
		path := "/v1/completions"
		if strings.HasPrefix(name, "chat") {
			path = "/v1/chat/completions"
		}
		res := e.do(t, envoyclient.Request{Path: path, Body: raw})
		require.Nil(t, res.Immediate, name)
	}

	resp, encoded := fetchSummary(t, e.MetricsAddr(), "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, promptprefix.SummaryContentType, resp.Header.Get("Content-Type"))
	summary, err := promptprefix.ParseSummary(encoded)
	require.NoError(t, err)
	for name, raw := range bodies {
		b, err := requestmodel.ReadBody(raw)
		require.NoError(t, err, name)
		blocks, err := b.Prompt().Blocks(nil, promptprefix.ScopeOfModel(b.Model()))
		require.NoError(t, err, name)
		require.Greater(t, len(blocks), 30, name)
		assert.Equal(t, len(blocks), summary.Held(blocks), name)
		other, err := b.Prompt().Blocks(nil, promptprefix.ScopeOfModel("another-model"))
		require.NoError(t, err)
		assert.Zero(t, summary.Held(other), "%s, for another model", name)
	}

	// A scraper that holds it is told so, and the Prometheus exposition
	// is still what the URL serves by default.
	resp, body := fetchSummary(t, e.MetricsAddr(), resp.Header.Get("ETag"))
	assert.Equal(t, http.StatusNotModified, resp.StatusCode)
	assert.Empty(t, body)
	assert.Equal(t, "1", metricValue(t, e.MetricsAddr(), `mci_epp_prefix_summary_requests_total{result="unchanged"}`))
	assert.Equal(t, "1", metricValue(t, e.MetricsAddr(), `mci_epp_prefix_summary_requests_total{result="sent"}`))
	assert.NotEmpty(t, metricValue(t, e.MetricsAddr(), `mci_epp_prefix_summary_blocks`))
	assert.Equal(t, strconv.Itoa(len(encoded)), metricValue(t, e.MetricsAddr(), `mci_epp_prefix_summary_sent_bytes_total`), "the one summary sent")
}
