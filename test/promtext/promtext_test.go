package promtext

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const page = `# HELP requests_total Requests served.
# TYPE requests_total counter
requests_total{code="200",verb="GET"} 7
requests_total{code="503",verb="GET"} 2
requests_total{code="200",verb="WATCH"} 3
# TYPE goroutines gauge
goroutines 42
# TYPE latency_seconds histogram
latency_seconds_bucket{le="+Inf"} 1
latency_seconds_sum 0.5
latency_seconds_count 1
`

func TestSeriesAreReadAsWrittenWithLabelsInAnyOrder(t *testing.T) {
	m, err := Parse([]byte(page))
	require.NoError(t, err)
	tests := []struct {
		name   string
		series string
		want   float64
		found  bool
	}{
		{"an unlabelled gauge", "goroutines", 42, true},
		{"a counter with its labels", `requests_total{code="503",verb="GET"}`, 2, true},
		{"labels in another order", `requests_total{verb="WATCH",code="200"}`, 3, true},
		{"a subset of the labels is not the series", `requests_total{code="200"}`, 0, false},
		{"an absent metric", "absent_total", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, found, err := m.Lookup(tc.series)
			require.NoError(t, err)
			assert.Equal(t, tc.found, found)
			assert.Equal(t, tc.want, v)
			assert.Equal(t, tc.want, m.Value(t, tc.series))
		})
	}
}

func TestAMalformedSeriesIsAnError(t *testing.T) {
	m, err := Parse([]byte(page))
	require.NoError(t, err)
	_, _, err = m.Lookup(`requests_total{code="200"`)
	require.Error(t, err)
	_, _, err = m.Lookup(`requests_total{code=200}`)
	require.Error(t, err, "an unquoted label value")
}

func TestSumAddsTheSeriesThatIncludeTheLabels(t *testing.T) {
	m, err := Parse([]byte(page))
	require.NoError(t, err)
	assert.Equal(t, 9.0, m.Sum("requests_total", map[string]string{"verb": "GET"}))
	assert.Equal(t, 12.0, m.Sum("requests_total", nil))
	assert.Equal(t, 0.0, m.Sum("absent_total", nil))
	assert.Len(t, m.Samples("requests_total"), 3)
	assert.Empty(t, m.Samples("latency_seconds"), "a histogram has no single value")
}

func TestGetParsesAPageAndRefusesAnotherStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte(page))
	}))
	defer srv.Close()
	m, err := Get(t.Context(), srv.URL+"/metrics")
	require.NoError(t, err)
	assert.Equal(t, 42.0, m.Value(t, "goroutines"))
	_, err = Get(t.Context(), srv.URL+"/other")
	require.ErrorContains(t, err, "403")
}

func TestAPageThatIsNotTheTextFormatIsAnError(t *testing.T) {
	_, err := Parse([]byte("requests_total{code=\"200\" 7\n"))
	require.Error(t, err)
}

func TestSumMatchingAddsTheSeriesThatIncludeTheSelectorsLabels(t *testing.T) {
	m, err := Parse([]byte(page))
	require.NoError(t, err)
	for selector, want := range map[string]float64{
		`requests_total{code="200"}`:            10,
		`requests_total{verb="GET",code="503"}`: 2,
		`requests_total`:                        12,
		`absent_total{code="200"}`:              0,
	} {
		got, err := m.SumMatching(selector)
		require.NoError(t, err)
		assert.Equal(t, want, got, selector)
	}
	_, err = m.SumMatching(`requests_total{code=}`)
	require.Error(t, err)
}

func TestHistogramMatchingAddsTheObservationsOfTheSeriesThatIncludeTheLabels(t *testing.T) {
	m, err := Parse([]byte(`# TYPE pass_seconds histogram
pass_seconds_bucket{kind="a",work="objects",le="+Inf"} 3
pass_seconds_sum{kind="a",work="objects"} 1.5
pass_seconds_count{kind="a",work="objects"} 3
pass_seconds_bucket{kind="b",work="objects",le="+Inf"} 2
pass_seconds_sum{kind="b",work="objects"} 0.25
pass_seconds_count{kind="b",work="objects"} 2
pass_seconds_bucket{kind="a",work="versions",le="+Inf"} 5
pass_seconds_sum{kind="a",work="versions"} 0.01
pass_seconds_count{kind="a",work="versions"} 5
`))
	require.NoError(t, err)
	count, sum, err := m.HistogramMatching(`pass_seconds{kind="a",work="objects"}`)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), count)
	assert.InDelta(t, 1.5, sum, 1e-9)
	count, sum, err = m.HistogramMatching(`pass_seconds{work="objects"}`)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), count)
	assert.InDelta(t, 1.75, sum, 1e-9)
	count, _, err = m.HistogramMatching(`absent_seconds`)
	require.NoError(t, err)
	assert.Zero(t, count)
	_, _, err = m.HistogramMatching(`pass_seconds{`)
	assert.Error(t, err)
}
