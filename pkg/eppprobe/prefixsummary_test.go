package eppprobe

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// summaryEPP serves pool gauges, and a prefix summary to a scraper that
// accepts one first, as mci-epp's metrics URL does (an ETag, 304 to a
// scraper that holds it, the delta from an earlier version to one that
// holds that and accepts deltas); answer, when set, answers the
// summary's requests instead, as EPPs that publish none or publish
// garbage do.
type summaryEPP struct {
	*httptest.Server
	mu       sync.Mutex
	summary  []byte
	version  int
	versions map[string]*promptprefix.Summary
	answer   http.HandlerFunc
	asked    int
	notMod   int
	deltas   int
	lastAuth string
}

func newSummaryEPP(t *testing.T, blocks ...uint64) *summaryEPP {
	e := &summaryEPP{}
	e.setSummary(t, blocks...)
	e.Server = httptest.NewServer(e)
	t.Cleanup(e.Close)
	return e
}

func (e *summaryEPP) setSummary(t *testing.T, blocks ...uint64) {
	s := promptprefix.NewSummary(len(blocks))
	for _, b := range blocks {
		s.Add(b)
	}
	encoded, err := s.AppendBinary(nil)
	require.NoError(t, err)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.summary = encoded
	e.version++
	if e.versions == nil {
		e.versions = map[string]*promptprefix.Summary{}
	}
	e.versions[e.etag()] = s
}

func (e *summaryEPP) etag() string { return `"` + strconv.Itoa(e.version) + `"` }

func (e *summaryEPP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	accept := strings.Split(r.Header.Get("Accept"), ", ")
	if accept[0] != promptprefix.SummaryContentType {
		_, _ = w.Write([]byte(gauges("llm", 1)))
		return
	}
	e.mu.Lock()
	e.asked++
	e.lastAuth = r.Header.Get("Authorization")
	summary, answer, etag := e.summary, e.answer, e.etag()
	held, current := e.versions[r.Header.Get("If-None-Match")], e.versions[etag]
	e.mu.Unlock()
	if answer != nil {
		answer(w, r)
		return
	}
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		e.mu.Lock()
		e.notMod++
		e.mu.Unlock()
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if slices.Contains(accept, promptprefix.SummaryDeltaContentType) {
		if delta, ok := current.AppendDelta(nil, held); ok {
			e.mu.Lock()
			e.deltas++
			e.mu.Unlock()
			w.Header().Set("Content-Type", promptprefix.SummaryDeltaContentType)
			_, _ = w.Write(delta)
			return
		}
	}
	w.Header().Set("Content-Type", promptprefix.SummaryContentType)
	_, _ = w.Write(summary)
}

func (e *summaryEPP) counts() (asked, notModified int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.asked, e.notMod
}

func TestPoolScraperReadsThePrefixSummaryBesideTheGauges(t *testing.T) {
	e := newSummaryEPP(t, 11, 12, 13)
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 10 * time.Millisecond, Timeout: time.Second, PrefixSummaryInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	s.SetTargets([]string{e.URL})
	runScraper(t, s, nil)
	require.Eventually(t, func() bool { g := s.Get(e.URL, "llm"); return g != nil && g.Prefixes != nil }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 3, s.Get(e.URL, "llm").Prefixes.Held([]uint64{11, 12, 13, 14}))

	// Asked once an interval, not once a scrape; the summary held is
	// told current (304) and kept.
	time.Sleep(500 * time.Millisecond)
	asked, notModified := e.counts()
	assert.LessOrEqual(t, asked, 7, "asked %d times in about 5 intervals", asked)
	assert.GreaterOrEqual(t, notModified, 2)
	assert.Equal(t, 3, s.Get(e.URL, "llm").Prefixes.Held([]uint64{11, 12, 13, 14}))

	e.setSummary(t, 11, 12, 13, 14, 15)
	require.Eventually(t, func() bool {
		return s.Get(e.URL, "llm").Prefixes.Held([]uint64{11, 12, 13, 14}) == 4
	}, 5*time.Second, 5*time.Millisecond)
	assert.Positive(t, testutil.ToFloat64(s.summaryFetches.WithLabelValues(SummaryFetched)))
	assert.Positive(t, testutil.ToFloat64(s.summaryFetches.WithLabelValues(SummaryUnchanged)))
}

// TestPoolScraperHoldingASummaryIsSentWhatChanged: a scraper that holds a
// summary asks for the delta from it too, and makes the new summary from
// it; a delta that does not apply to the summary held drops it, said
// once, and the next ask is sent the summary whole.
func TestPoolScraperHoldingASummaryIsSentWhatChanged(t *testing.T) {
	blocks := make([]uint64, 200)
	for i := range blocks {
		blocks[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	e := newSummaryEPP(t, blocks[:100]...)
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 10 * time.Millisecond, Timeout: time.Second, PrefixSummaryInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	s.SetTargets([]string{e.URL})
	var logs logLines
	runScraper(t, s, &logs)
	held := func() int {
		g := s.Get(e.URL, "llm")
		if g == nil {
			return 0
		}
		return g.Prefixes.Held(blocks[100:102])
	}
	require.Eventually(t, func() bool { g := s.Get(e.URL, "llm"); return g != nil && g.Prefixes != nil }, 5*time.Second, 5*time.Millisecond)

	e.setSummary(t, blocks[:101]...)
	require.Eventually(t, func() bool { return held() == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.summaryFetches.WithLabelValues(SummaryDelta)))
	assert.Equal(t, 1.0, testutil.ToFloat64(s.summaryFetches.WithLabelValues(SummaryFetched)))

	// A delta from another summary than the one held.
	e.mu.Lock()
	e.answer = func(w http.ResponseWriter, _ *http.Request) {
		other := promptprefix.NewSummary(100)
		next := promptprefix.NewSummary(100)
		next.Add(blocks[101])
		delta, ok := next.AppendDelta(nil, other)
		require.True(t, ok)
		w.Header().Set("Content-Type", promptprefix.SummaryDeltaContentType)
		w.Header().Set("ETag", `"another"`)
		_, _ = w.Write(delta)
	}
	e.mu.Unlock()
	require.Eventually(t, func() bool {
		g := s.Get(e.URL, "llm")
		return g != nil && g.Prefixes == nil
	}, 5*time.Second, 5*time.Millisecond)
	assert.Positive(t, testutil.ToFloat64(s.summaryFetches.WithLabelValues(SummaryRefused)))

	e.mu.Lock()
	e.answer = nil
	e.mu.Unlock()
	e.setSummary(t, blocks[:102]...)
	require.Eventually(t, func() bool { return held() == 2 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 2.0, testutil.ToFloat64(s.summaryFetches.WithLabelValues(SummaryFetched)), "sent whole after the refusal")
	assert.Equal(t, 2, logs.count(`"result"="fetched"`)+logs.count(`"result"="delta"`), "read, said once each time it is read again")
	assert.Equal(t, 1, logs.count(`"result"="refused"`))
}

// TestPoolScraperScoresWithoutASummaryItCannotRead: an upstream EPP, one
// that refuses the media type, garbage and a failing EPP leave its
// clusters without reported prefixes, said once per change, and the
// gauges as they were.
func TestPoolScraperScoresWithoutASummaryItCannotRead(t *testing.T) {
	for _, tt := range []struct {
		name   string
		answer http.HandlerFunc
		want   string
	}{
		{"an upstream EPP answers its exposition", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(gauges("llm", 1))) }, SummaryNotPublished},
		{"an EPP refuses the media type", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotAcceptable) }, SummaryNotPublished},
		{"an EPP sends garbage as a summary", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", promptprefix.SummaryContentType)
			_, _ = w.Write([]byte("mci\x01not a filter"))
		}, SummaryRefused},
		{"an EPP sends a summary beyond the bound", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", promptprefix.SummaryContentType)
			_, _ = w.Write(make([]byte, promptprefix.MaxSummaryBytes+100))
		}, SummaryRefused},
		{"an EPP fails", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusInternalServerError) }, SummaryFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newSummaryEPP(t, 1, 2, 3)
			e.answer = tt.answer
			s, err := NewPoolScraper(PoolScraperOptions{Interval: 10 * time.Millisecond, Timeout: time.Second, PrefixSummaryInterval: 20 * time.Millisecond})
			require.NoError(t, err)
			s.SetTargets([]string{e.URL})
			var logs logLines
			runScraper(t, s, &logs)
			require.Eventually(t, func() bool {
				return testutil.ToFloat64(s.summaryFetches.WithLabelValues(tt.want)) >= 3
			}, 5*time.Second, 5*time.Millisecond)
			g := s.Get(e.URL, "llm")
			require.NotNil(t, g)
			assert.Nil(t, g.Prefixes)
			assert.Equal(t, 1.0, g.AverageQueue, "the gauges are read as ever")
			assert.Equal(t, 1, logs.count(`"result"="`+tt.want+`"`), "said once, not at every ask")
		})
	}
}

func TestPoolScraperAsksForNoSummaryWhenToldNever(t *testing.T) {
	e := newSummaryEPP(t, 1)
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 10 * time.Millisecond, Timeout: time.Second, PrefixSummaryInterval: -1})
	require.NoError(t, err)
	s.SetTargets([]string{e.URL})
	runScraper(t, s, nil)
	require.Eventually(t, func() bool { return s.Get(e.URL, "llm") != nil }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	asked, _ := e.counts()
	assert.Zero(t, asked)
	assert.Nil(t, s.Get(e.URL, "llm").Prefixes)
}
