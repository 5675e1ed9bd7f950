package routingpolicy

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Config
		wantErr string
	}{
		{
			name: "a named configuration is found by its name",
			in:   " MetricsBased ",
			want: Named()[MetricsBased],
		},
		{
			name: "scorers with weights, the default filters and picker",
			in:   "prefix-cache=3, session=2,in-flight=1,queue=0.5",
			want: Config{
				Name:    "prefix-cache=3, session=2,in-flight=1,queue=0.5",
				Filters: []Filter{FilterHealth, FilterReady, FilterWeight, FilterModel, FilterSaturation},
				Scorers: []WeightedScorer{{ScorePrefixCache, 3}, {ScoreSession, 2}, {ScoreInFlight, 1}, {ScoreQueue, 0.5}},
				Picker:  PickMaxScore,
				// Affinity yields to load unless told otherwise, and the
				// queue margin is the affinity margin.
				AffinityMargin: DefaultAffinityMargin, QueueMargin: DefaultAffinityMargin,
			},
		},
		{
			name: "a picker and filters of one's own",
			in:   "in-flight=1,pick=two-choices,filters=health+saturation",
			want: Config{
				Name:           "in-flight=1,pick=two-choices,filters=health+saturation",
				Filters:        []Filter{FilterHealth, FilterSaturation},
				Scorers:        []WeightedScorer{{ScoreInFlight, 1}},
				Picker:         PickTwoChoices,
				AffinityMargin: DefaultAffinityMargin,
				QueueMargin:    DefaultAffinityMargin,
			},
		},
		{
			name: "round-robin needs no scorer",
			in:   "pick=round-robin",
			want: Config{Name: "pick=round-robin", Filters: defaultFilters, Picker: PickRoundRobin, AffinityMargin: DefaultAffinityMargin, QueueMargin: DefaultAffinityMargin},
		},
		{
			name: "an affinity margin of one's own",
			in:   "prefix-cache=3,in-flight=1,affinity-margin=2.5",
			want: Config{
				Name:    "prefix-cache=3,in-flight=1,affinity-margin=2.5",
				Filters: defaultFilters,
				Scorers: []WeightedScorer{{ScorePrefixCache, 3}, {ScoreInFlight, 1}},
				Picker:  PickMaxScore, AffinityMargin: 2.5, QueueMargin: 2.5,
			},
		},
		{
			name: "a queue margin of one's own, apart from the affinity margin",
			in:   "prefix-cache=3,in-flight=1,home-bound=2,affinity-margin=2.5,queue-margin=off",
			want: Config{
				Name:    "prefix-cache=3,in-flight=1,home-bound=2,affinity-margin=2.5,queue-margin=off",
				Filters: defaultFilters,
				Scorers: []WeightedScorer{{ScorePrefixCache, 3}, {ScoreInFlight, 1}},
				Picker:  PickMaxScore, AffinityMargin: 2.5, QueueMargin: -1, HomeBound: 2,
			},
		},
		{
			name: "PrefixAffinity written out is the PrefixAffinity configuration",
			in:   "prefix-cache=3,session=2,in-flight=1,latency=1,errors=1,queue=1,kv-cache=1,affinity-margin=1,queue-margin=1,home-bound=2",
			want: func() Config {
				c := Named()[PrefixAffinity]
				c.Name = "prefix-cache=3,session=2,in-flight=1,latency=1,errors=1,queue=1,kv-cache=1,affinity-margin=1,queue-margin=1,home-bound=2"
				return c
			}(),
		},
		{
			name: "the llm-d hub's documented weights, written out, are the HubReference configuration",
			in:   "prefix-cache=3,queue=2,kv-cache=2,pick=max-score,affinity-margin=off,prefix-reports=off",
			want: func() Config {
				c := Named()[HubReference]
				c.Name = "prefix-cache=3,queue=2,kv-cache=2,pick=max-score,affinity-margin=off,prefix-reports=off"
				return c
			}(),
		},
		{
			name: "the EPPs' prefix reports are read unless turned off",
			in:   "prefix-cache=3,prefix-reports=on",
			want: Config{
				Name: "prefix-cache=3,prefix-reports=on", Filters: defaultFilters,
				Scorers: []WeightedScorer{{ScorePrefixCache, 3}}, Picker: PickMaxScore, AffinityMargin: DefaultAffinityMargin, QueueMargin: DefaultAffinityMargin,
			},
		},
		{
			name: "home placement with a load bound of one's own",
			in:   "prefix-cache=3,in-flight=1,home-bound=1.5",
			want: Config{
				Name: "prefix-cache=3,in-flight=1,home-bound=1.5", Filters: defaultFilters,
				Scorers: []WeightedScorer{{ScorePrefixCache, 3}, {ScoreInFlight, 1}},
				Picker:  PickMaxScore, AffinityMargin: DefaultAffinityMargin, QueueMargin: DefaultAffinityMargin, HomeBound: 1.5,
			},
		},
		{
			name: "affinity that never yields to load",
			in:   "session=1,affinity-margin=off",
			want: Config{
				Name: "session=1,affinity-margin=off", Filters: defaultFilters,
				Scorers: []WeightedScorer{{ScoreSession, 1}}, Picker: PickMaxScore, AffinityMargin: -1, QueueMargin: -1,
			},
		},
		{name: "a negative affinity margin is refused", in: "session=1,affinity-margin=-1", wantErr: `affinity-margin "-1" is not off`},
		{name: "a NaN affinity margin is refused", in: "session=1,affinity-margin=NaN", wantErr: `affinity-margin "NaN" is not off`},
		{name: "an affinity margin given twice is refused", in: "session=1,affinity-margin=1,affinity-margin=2", wantErr: "affinity-margin given twice"},
		{name: "a negative queue margin is refused", in: "session=1,home-bound=2,queue-margin=-1", wantErr: `queue-margin "-1" is not off`},
		{name: "a queue margin above 1000 is refused", in: "session=1,home-bound=2,queue-margin=1001", wantErr: `queue-margin "1001" is not off or a number from 0 to 1000`},
		{name: "a queue margin given twice is refused", in: "session=1,queue-margin=1,queue-margin=off", wantErr: "queue-margin given twice"},
		{name: "an empty value is refused", in: "  ", wantErr: "empty"},
		{name: "an unknown name is refused with the known ones", in: "RoundRobin", wantErr: `unknown configuration "RoundRobin"; want one of [Weighted HealthBased MetricsBased LocalFirst PrefixAffinity HubReference]`},
		{name: "a home bound below 1 is refused", in: "prefix-cache=1,home-bound=0.5", wantErr: `home-bound "0.5" is not off or a number from 1 to 100`},
		{name: "a home bound needs a scoring picker", in: "prefix-cache=1,pick=round-robin,home-bound=1.5", wantErr: "home-bound needs the max-score or two-choices picker, not round-robin"},
		{name: "prefix reports are on or off", in: "prefix-cache=1,prefix-reports=maybe", wantErr: `prefix-reports "maybe" is not on or off`},
		{name: "a home bound given twice is refused", in: "prefix-cache=1,home-bound=2,home-bound=off", wantErr: "home-bound given twice"},
		{name: "an unknown scorer is refused", in: "prefix=3", wantErr: `unknown scorer "prefix"`},
		{name: "a scorer given twice is refused", in: "queue=1,queue=2", wantErr: "scorer queue given twice"},
		{name: "a weight of 0 is refused", in: "queue=0", wantErr: `weight "0" of queue`},
		{name: "a negative weight is refused", in: "queue=-1", wantErr: `weight "-1" of queue`},
		{name: "NaN is refused", in: "queue=NaN", wantErr: `weight "NaN" of queue`},
		{name: "infinity is refused", in: "queue=+Inf", wantErr: `weight "+Inf" of queue`},
		{name: "a weight above 1000 is refused", in: "queue=1001", wantErr: `weight "1001" of queue`},
		{name: "an item without a value is refused", in: "queue=1,", wantErr: `item "" is not <name>=<value>`},
		{name: "an unknown picker is refused", in: "queue=1,pick=best", wantErr: `unknown picker "best"`},
		{name: "pick given twice is refused", in: "queue=1,pick=chain,pick=chain", wantErr: "pick given twice"},
		{name: "an unknown filter is refused", in: "queue=1,filters=health+lucky", wantErr: `unknown filter "lucky"`},
		{name: "a filter given twice is refused", in: "queue=1,filters=health+health", wantErr: "filter health given twice"},
		{name: "a scoring picker without scorers is refused", in: "pick=max-score", wantErr: "picker max-score needs at least one scorer"},
		{name: "an overlong value is refused", in: strings.Repeat("queue=1,", 100), wantErr: "at most 512"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, ErrSyntax)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestNamedConfigurationsAreValid(t *testing.T) {
	for _, name := range Names {
		cfg, err := Parse(name)
		require.NoError(t, err, name)
		assert.NoError(t, cfg.Validate(), name)
		assert.Equal(t, name, cfg.Canonical(), "a named configuration is written by its name")
	}
}

func TestValidateRefusesWhatParseWouldRefuse(t *testing.T) {
	base := Named()[PrefixAffinity]
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"a picker that does not exist", func(c *Config) { c.Picker = numPickers }, "unknown picker"},
		{"no filter", func(c *Config) { c.Filters = nil }, "no filter"},
		{"a filter twice", func(c *Config) { c.Filters = []Filter{FilterHealth, FilterHealth} }, "filter health given twice"},
		{"a scorer of weight 0", func(c *Config) { c.Scorers = []WeightedScorer{{ScoreQueue, 0}} }, "weight 0 of queue"},
		{"a scorer twice", func(c *Config) { c.Scorers = []WeightedScorer{{ScoreQueue, 1}, {ScoreQueue, 2}} }, "scorer queue given twice"},
		{"a NaN margin", func(c *Config) { c.AffinityMargin = math.NaN() }, "affinity-margin NaN"},
		{"a negative margin other than off", func(c *Config) { c.QueueMargin = -0.5 }, "queue-margin -0.5"},
		{"a home bound below 1", func(c *Config) { c.HomeBound = 0.5 }, "home bound 0.5"},
		{"a home bound with round-robin", func(c *Config) { c.Picker = PickRoundRobin }, "home-bound needs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			c.Filters, c.Scorers = slices.Clone(c.Filters), slices.Clone(c.Scorers)
			tt.change(&c)
			err := c.Validate()
			require.ErrorIs(t, err, ErrSyntax)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestCanonicalWritesEveryItem(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{in: " MetricsBased ", want: "MetricsBased"},
		{in: "prefix-cache=3, in-flight=1,pick=two-choices",
			want: "prefix-cache=3,in-flight=1,pick=two-choices,filters=health+ready+weight+model+saturation,affinity-margin=1,queue-margin=1,home-bound=off"},
		{in: "queue=1e1,filters=health,affinity-margin=off,home-bound=2",
			want: "queue=10,pick=max-score,filters=health,affinity-margin=off,queue-margin=off,home-bound=2"},
		{in: "pick=round-robin,filters=weight+model",
			want: "pick=round-robin,filters=weight+model,affinity-margin=1,queue-margin=1,home-bound=off"},
		// Written only when off: a reader of a release before the reports
		// reads none either way.
		{in: "prefix-reports=off,prefix-cache=1",
			want: "prefix-cache=1,pick=max-score,filters=health+ready+weight+model+saturation,affinity-margin=1,queue-margin=1,home-bound=off,prefix-reports=off"},
		{in: "prefix-reports=on,prefix-cache=1",
			want: "prefix-cache=1,pick=max-score,filters=health+ready+weight+model+saturation,affinity-margin=1,queue-margin=1,home-bound=off"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c, err := Parse(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, c.Canonical())
			back, err := Parse(c.Canonical())
			require.NoError(t, err)
			c.Name = back.Name
			assert.Equal(t, c, back, "the canonical form reads back to the same configuration")
		})
	}
}

func TestParseNamesAConfigurationByItsTextTrimmed(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "LocalFirst", want: LocalFirst},
		{in: " PrefixAffinity ", want: PrefixAffinity},
		{in: "prefix-cache=3,in-flight=1,pick=two-choices", want: "prefix-cache=3,in-flight=1,pick=two-choices"},
		{in: "session=1, filters=health+weight", want: "session=1, filters=health+weight"},
		{in: "RoundRobin", wantErr: true},
		{in: "", wantErr: true},
		{in: "prefix-cache=0", wantErr: true},
		{in: "pick=two-choices", wantErr: true},
		{in: "prefix-cache=1,prefix-cache=2", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr {
				assert.ErrorIs(t, err, ErrSyntax)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Name)
		})
	}
}
