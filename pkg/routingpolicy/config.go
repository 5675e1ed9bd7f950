package routingpolicy

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Filter is one stage that decides, before any scoring, whether a candidate
// may take the request at all, and in which tier it waits.
type Filter uint8

// The filters. Their order in a configuration does not matter: each looks
// at one property of a candidate.
const (
	// FilterHealth drops candidates whose EPP is known not to be serving.
	// Under the round-robin and chain pickers, candidates of unknown health
	// come after the serving ones.
	FilterHealth Filter = iota
	// FilterReady drops candidates whose Ready condition is False, and
	// those whose fresh pool metrics count no ready pod.
	FilterReady
	// FilterWeight drops candidates of weight 0 or less.
	FilterWeight
	// FilterModel drops candidates known not to serve the request's model.
	FilterModel
	// FilterSaturation puts candidates whose fresh pool metrics say they
	// are saturated last, and drops them for a sheddable request, which is
	// shed (ErrShed) when nothing else remains.
	FilterSaturation
	// FilterLocalFirst puts the local pool first while its EPP is not known
	// to be failing.
	FilterLocalFirst
	// NumFilters is how many filters there are.
	NumFilters
)

var filterNames = [NumFilters]string{"health", "ready", "weight", "model", "saturation", "local-first"}

func (f Filter) String() string {
	if f < NumFilters {
		return filterNames[f]
	}
	return "Filter(" + strconv.Itoa(int(f)) + ")"
}

// Scorer names one scorer. Each scores every candidate left by the filters
// in [0, 1], higher is better.
type Scorer uint8

// The scorers.
const (
	// ScorePrefixCache is the share of the request's leading prompt blocks
	// that the candidate served last (promptprefix.Index).
	ScorePrefixCache Scorer = iota
	// ScoreSession is 1 for the candidate the request's session is pinned
	// to, 0 for the others.
	ScoreSession
	// ScoreLatency is the lowest observed time to first byte among the
	// candidates divided by the candidate's (Observer).
	ScoreLatency
	// ScoreErrors is 1 minus the candidate's observed error ratio.
	ScoreErrors
	// ScoreInFlight is (least in-flight + 1) / (the candidate's in-flight +
	// 1): requests this sidecar has sent and not yet seen finish.
	ScoreInFlight
	// ScoreQueue is 1 / (1 + queue/q0) of the pool's average queue, q0 the
	// sheddable queue threshold (at least 1); 0.5 when unmeasured.
	ScoreQueue
	// ScoreKVCache is 1 minus the pool's average KV cache utilization; 0.5
	// when unmeasured.
	ScoreKVCache
	// ScoreWeight is the candidate's configured weight over the largest.
	ScoreWeight
	// NumScorers is how many scorers there are.
	NumScorers
)

var scorerNames = [NumScorers]string{"prefix-cache", "session", "latency", "errors", "in-flight", "queue", "kv-cache", "weight"}

func (s Scorer) String() string {
	if s < NumScorers {
		return scorerNames[s]
	}
	return "Scorer(" + strconv.Itoa(int(s)) + ")"
}

// Picker turns the tiers and scores into the failover order.
type Picker uint8

// The pickers.
const (
	// PickMaxScore takes the highest total of the first tier, ties broken
	// at random; the rest follow by total.
	PickMaxScore Picker = iota
	// PickTwoChoices draws two candidates of the first tier at random and
	// takes the higher total (power of two choices); the rest follow by
	// total.
	PickTwoChoices
	// PickRoundRobin takes the first candidate by smooth weighted
	// round-robin (Rotation); the rest follow by weight, then name.
	PickRoundRobin
	// PickChain ranks measured candidates with the filter chain of
	// pkg/scheduling, unmeasured ones as PickRoundRobin does (MetricsBased).
	PickChain
	numPickers
)

var pickerNames = [numPickers]string{"max-score", "two-choices", "round-robin", "chain"}

func (p Picker) String() string {
	if p < numPickers {
		return pickerNames[p]
	}
	return "Picker(" + strconv.Itoa(int(p)) + ")"
}

// WeightedScorer is a scorer and what its score counts for in the total.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// Config is a named configuration of the pipeline.
type Config struct {
	// Name is the configuration's name, or the annotation text it was
	// parsed from.
	Name    string
	Filters []Filter
	Scorers []WeightedScorer
	Picker  Picker
	// AffinityMargin is how far, in requests per ready pod, a candidate's
	// load may be above the least loaded candidate's for its affinity (the
	// prefix-cache and session scores) to count; beyond it those score 0.
	// A candidate's load is its scraped average queue plus this sidecar's
	// requests in flight to it per ready pod. Negative: affinity counts
	// whatever the load. It matters only with an affinity scorer.
	AffinityMargin float64
	// QueueMargin is how far, in waiting requests per server, the home's
	// scraped queue may be above the least queued candidate's of the first
	// tier before the home counts as loaded whatever its bound (the queue
	// rule of pkg/clusterscore): its servers are then taken by traffic this
	// sidecar does not see. Negative: no such rule. It matters only with
	// a home bound.
	QueueMargin float64
	// HomeBound, when not 0, gives each request with a prompt a home
	// cluster, hashed from its leading prompt blocks, that takes it while
	// its load stays within HomeBound (at least 1) times its capacity's
	// share of the total (leadHome); else the best scored candidate within
	// the bound does. It needs the max-score or two-choices picker.
	HomeBound float64
	// IgnorePrefixReports: the prefix-cache score and home placement read
	// this sidecar's own memory only, not what the candidates' EPPs report
	// their servers hold (their prefix summaries): prefix-reports=off.
	// HubReference has it, as the hub it stands for reads no such report.
	IgnorePrefixReports bool
}

// Has reports whether the configuration includes the filter.
func (c Config) Has(f Filter) bool { return slices.Contains(c.Filters, f) }

// The named configurations. The first four are the sidecar's policies of
// old, with their exact behaviour.
const (
	Weighted       = "Weighted"
	HealthBased    = "HealthBased"
	MetricsBased   = "MetricsBased"
	LocalFirst     = "LocalFirst"
	PrefixAffinity = "PrefixAffinity"
	// HubReference is the scoring the llm-d router documents for its
	// multi-cluster hub (approximate prefix cache 3, queue 2, KV cache 2,
	// max-score, no margin), expressed in this pipeline: the peer that
	// routing benchmarks compare PrefixAffinity with.
	HubReference = "HubReference"
)

// DefaultAffinityMargin is the affinity margin of PrefixAffinity and of
// written configurations that do not set one: affinity counts for a
// cluster while its load is at most one request per ready pod above the
// least loaded cluster's.
const DefaultAffinityMargin = 1.0

// DefaultHomeBound is PrefixAffinity's load bound: a home keeps its
// requests while its load, the request included, is at most twice its
// capacity's share of the candidates' total (rounded up).
const DefaultHomeBound = 2

// MaxHomeBound bounds the load bound a configuration may give.
const MaxHomeBound = 100

// DefaultQueueMargin is PrefixAffinity's queue margin: its home counts as
// loaded when its servers' waiting queue is more than one request per
// server above the least queued cluster's. A written configuration that
// does not set one takes its affinity margin, the one margin both rules
// read before they had a setting each.
const DefaultQueueMargin = 1.0

// defaultFilters are the filters of a configuration written as scorers.
var defaultFilters = []Filter{FilterHealth, FilterReady, FilterWeight, FilterModel, FilterSaturation}

// Named returns the named configurations, by name.
func Named() map[string]Config {
	return map[string]Config{
		Weighted:    {Name: Weighted, Filters: []Filter{FilterWeight, FilterModel}, Picker: PickRoundRobin},
		HealthBased: {Name: HealthBased, Filters: []Filter{FilterHealth, FilterWeight, FilterModel}, Picker: PickRoundRobin},
		LocalFirst:  {Name: LocalFirst, Filters: []Filter{FilterHealth, FilterWeight, FilterModel, FilterLocalFirst}, Picker: PickRoundRobin},
		// The in-flight scorer makes the chain count this sidecar's
		// requests in flight between two scrapes (no herding).
		MetricsBased: {Name: MetricsBased, Filters: defaultFilters, Scorers: []WeightedScorer{{ScoreInFlight, 1}}, Picker: PickChain},
		PrefixAffinity: {
			Name:    PrefixAffinity,
			Filters: defaultFilters,
			Scorers: []WeightedScorer{
				{ScorePrefixCache, 3}, {ScoreSession, 2}, {ScoreInFlight, 1},
				{ScoreLatency, 1}, {ScoreErrors, 1}, {ScoreQueue, 1}, {ScoreKVCache, 1},
			},
			Picker:         PickMaxScore,
			AffinityMargin: DefaultAffinityMargin,
			QueueMargin:    DefaultQueueMargin,
			HomeBound:      DefaultHomeBound,
		},
		HubReference: {
			Name:           HubReference,
			Filters:        defaultFilters,
			Scorers:        []WeightedScorer{{ScorePrefixCache, 3}, {ScoreQueue, 2}, {ScoreKVCache, 2}},
			Picker:         PickMaxScore,
			AffinityMargin: -1,
			// The llm-d hub learns prefixes from its own traffic only.
			IgnorePrefixReports: true,
			QueueMargin:         -1,
		},
	}
}

// Names lists the named configurations.
var Names = []string{Weighted, HealthBased, MetricsBased, LocalFirst, PrefixAffinity, HubReference}

// maxAnnotation bounds the annotation text Parse reads; annotations are
// small, and a long one is a mistake.
const maxAnnotation = 512

// maxWeight bounds a scorer's weight so that totals stay comparable.
const maxWeight = 1000

// ErrSyntax is wrapped by every error of Parse.
var ErrSyntax = errors.New("invalid cluster scoring configuration")

// Parse reads a configuration from an annotation value: either the name of
// a named configuration (Names), or a comma-separated list of items
//
//	<scorer>=<weight>                 a scorer and its weight, 0 < weight <= 1000
//	pick=<picker>                     max-score (default), two-choices, round-robin, chain
//	filters=<filter>+<filter>...      instead of health+ready+weight+model+saturation
//	affinity-margin=<n>|off           requests per ready pod, 0 <= n <= 1000 (default 1)
//	queue-margin=<n>|off              waiting requests per server, 0 <= n <= 1000 (default: the affinity margin)
//	home-bound=<c>|off                home placement's load bound, 1 <= c <= 100 (default off)
//	prefix-reports=on|off             read the EPPs' prefix summaries (default on)
//
// such as "prefix-cache=3,session=2,in-flight=1,queue=1,kv-cache=1" or
// "in-flight=1,pick=two-choices". Spaces around items are ignored. Each
// item may appear once; at least one scorer is needed unless the picker
// is round-robin or chain, and home-bound needs max-score or two-choices.
func Parse(s string) (Config, error) {
	if len(s) > maxAnnotation {
		return Config{}, fmt.Errorf("%w: %d bytes, at most %d", ErrSyntax, len(s), maxAnnotation)
	}
	s = strings.TrimSpace(s)
	if c, ok := Named()[s]; ok {
		return c, nil
	}
	if s == "" {
		return Config{}, fmt.Errorf("%w: empty; want one of %v or a list such as %q", ErrSyntax, Names, "prefix-cache=3,in-flight=1")
	}
	if !strings.Contains(s, "=") {
		return Config{}, fmt.Errorf("%w: unknown configuration %q; want one of %v or a list such as %q", ErrSyntax, s, Names, "prefix-cache=3,in-flight=1")
	}
	ps := parser{c: Config{Name: s, Filters: defaultFilters, Picker: PickMaxScore, AffinityMargin: DefaultAffinityMargin}, seen: map[string]bool{}}
	for item := range strings.SplitSeq(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" || value == "" {
			return Config{}, fmt.Errorf("%w: item %q is not <name>=<value>", ErrSyntax, item)
		}
		if ps.seen[key] {
			if slices.Contains(scorerNames[:], key) {
				key = "scorer " + key
			}
			return Config{}, fmt.Errorf("%w: %s given twice", ErrSyntax, key)
		}
		ps.seen[key] = true
		if err := ps.item(key, value); err != nil {
			return Config{}, err
		}
	}
	c := ps.c
	if !ps.seen["queue-margin"] {
		c.QueueMargin = c.AffinityMargin
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// parser is the configuration Parse reads, item by item.
type parser struct {
	c    Config
	seen map[string]bool
}

// item reads one <key>=<value> item into the configuration.
func (ps *parser) item(key, value string) error {
	switch key {
	case "pick":
		i := slices.Index(pickerNames[:], value)
		if i < 0 {
			return fmt.Errorf("%w: unknown picker %q; want one of %v", ErrSyntax, value, pickerNames)
		}
		ps.c.Picker = Picker(i)
	case "filters":
		fs, err := parseFilters(value)
		if err != nil {
			return err
		}
		ps.c.Filters = fs
	case "affinity-margin", "queue-margin":
		m, err := parseMargin(key, value)
		if err != nil {
			return err
		}
		if key == "affinity-margin" {
			ps.c.AffinityMargin = m
		} else {
			ps.c.QueueMargin = m
		}
	case "prefix-reports":
		switch value {
		case "on":
			ps.c.IgnorePrefixReports = false
		case "off":
			ps.c.IgnorePrefixReports = true
		default:
			return fmt.Errorf("%w: prefix-reports %q is not on or off", ErrSyntax, value)
		}
	case "home-bound":
		if value == "off" {
			ps.c.HomeBound = 0
			return nil
		}
		b, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(b) || b < 1 || b > MaxHomeBound {
			return fmt.Errorf("%w: home-bound %q is not off or a number from 1 to %d", ErrSyntax, value, MaxHomeBound)
		}
		ps.c.HomeBound = b
	default:
		i := slices.Index(scorerNames[:], key)
		if i < 0 {
			return fmt.Errorf("%w: unknown scorer %q; want one of %v, pick, filters, affinity-margin, queue-margin, home-bound or prefix-reports", ErrSyntax, key, scorerNames)
		}
		w, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(w) || w <= 0 || w > maxWeight {
			return fmt.Errorf("%w: weight %q of %s is not a number above 0 and at most %d", ErrSyntax, value, key, maxWeight)
		}
		ps.c.Scorers = append(ps.c.Scorers, WeightedScorer{Scorer(i), w})
	}
	return nil
}

// parseMargin reads the value of a margin item: off (-1) or a number
// from 0 to maxWeight.
func parseMargin(key, value string) (float64, error) {
	if value == "off" {
		return -1, nil
	}
	m, err := strconv.ParseFloat(value, 64)
	if err != nil || math.IsNaN(m) || m < 0 || m > maxWeight {
		return 0, fmt.Errorf("%w: %s %q is not off or a number from 0 to %d", ErrSyntax, key, value, maxWeight)
	}
	return m, nil
}

func parseFilters(value string) ([]Filter, error) {
	var out []Filter
	for name := range strings.SplitSeq(value, "+") {
		i := slices.Index(filterNames[:], strings.TrimSpace(name))
		if i < 0 {
			return nil, fmt.Errorf("%w: unknown filter %q; want some of %v joined by +", ErrSyntax, name, filterNames)
		}
		if slices.Contains(out, Filter(i)) {
			return nil, fmt.Errorf("%w: filter %s given twice", ErrSyntax, name)
		}
		out = append(out, Filter(i))
	}
	return out, nil
}
