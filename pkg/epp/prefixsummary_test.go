package epp_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/test/envoyclient"
)

// fetchSummary asks the EPP's metrics URL for its prefix summary, as an
// importing cluster's sidecar does; etag, when set, is the one it holds,
// and accepted the media types it lists after the summary's.
func fetchSummary(t *testing.T, metricsAddr, etag string, accepted ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", strings.Join(append([]string{promptprefix.SummaryContentType}, accepted...), ", "))
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

// TestAScraperHoldingARecentSummaryIsSentWhatChanged: a scraper that
// holds a summary built lately and accepts deltas is sent the bits that
// flipped since, which make from it the summary sent whole; one that
// holds a summary the EPP does not know, or accepts no delta, is sent the
// whole summary.
func TestAScraperHoldingARecentSummaryIsSentWhatChanged(t *testing.T) {
	eps := startModelServers(t, pod("A", 0, 0.1), pod("B", 0, 0.1))
	e := startEPP(t, epp.Config{}, eps)
	route := func(text string) {
		raw, err := json.Marshal(map[string]any{"model": "base", "prompt": strings.Repeat(text, 60)})
		require.NoError(t, err)
		require.Nil(t, e.do(t, envoyclient.Request{Path: "/v1/completions", Body: raw}).Immediate)
	}
	route("The first prompt of the pool. ")
	resp, encoded := fetchSummary(t, e.MetricsAddr(), "", promptprefix.SummaryDeltaContentType)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, promptprefix.SummaryContentType, resp.Header.Get("Content-Type"), "no summary held: sent whole")
	held, err := promptprefix.ParseSummary(encoded)
	require.NoError(t, err)
	heldTag := resp.Header.Get("ETag")

	// Built again at most once a second.
	route("Another prompt, routed later. ")
	time.Sleep(epp.PrefixSummaryInterval + 100*time.Millisecond)
	resp, whole := fetchSummary(t, e.MetricsAddr(), heldTag)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, promptprefix.SummaryContentType, resp.Header.Get("Content-Type"), "no delta accepted: sent whole")
	currentTag := resp.Header.Get("ETag")
	require.NotEqual(t, heldTag, currentTag)

	for range 2 { // the second made once, then kept
		resp, delta := fetchSummary(t, e.MetricsAddr(), heldTag, promptprefix.SummaryDeltaContentType)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, promptprefix.SummaryDeltaContentType, resp.Header.Get("Content-Type"))
		assert.Equal(t, currentTag, resp.Header.Get("ETag"))
		assert.Less(t, len(delta), len(whole)/4, "%d bytes against %d whole", len(delta), len(whole))
		made, err := promptprefix.ApplyDelta(held, delta)
		require.NoError(t, err)
		encoded, err := made.AppendBinary(nil)
		require.NoError(t, err)
		assert.Equal(t, whole, encoded, "the delta makes the summary sent whole")
	}

	resp, body := fetchSummary(t, e.MetricsAddr(), `"not one it built"`, promptprefix.SummaryDeltaContentType)
	assert.Equal(t, promptprefix.SummaryContentType, resp.Header.Get("Content-Type"))
	assert.Equal(t, whole, body)
	resp, _ = fetchSummary(t, e.MetricsAddr(), currentTag, promptprefix.SummaryDeltaContentType)
	assert.Equal(t, http.StatusNotModified, resp.StatusCode)
	assert.Equal(t, "2", metricValue(t, e.MetricsAddr(), `mci_epp_prefix_summary_requests_total{result="delta"}`))
	assert.Equal(t, "3", metricValue(t, e.MetricsAddr(), `mci_epp_prefix_summary_requests_total{result="sent"}`))
}
