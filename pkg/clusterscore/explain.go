package clusterscore

import (
	"strconv"
	"strings"
	"time"

	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// Verdict is what the filters decided about a candidate.
type Verdict uint8

// The verdicts.
const (
	Kept Verdict = iota
	DroppedNotServing
	DroppedNotReady
	DroppedNoReadyPods
	DroppedWeight
	DroppedModel
	DroppedSaturated
	DroppedEjected
	DroppedDraining
	numVerdicts
)

var verdictNames = [numVerdicts]string{"kept", "not-serving", "not-ready", "no-ready-pods", "weight-0", "no-model", "saturated", "ejected", "draining"}

func (v Verdict) String() string {
	if v < numVerdicts {
		return verdictNames[v]
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// ClusterExplanation is why one candidate came where it did.
type ClusterExplanation struct {
	Name    string
	Verdict Verdict
	// Tier orders the kept candidates before any score: lower first
	// (saturated ones, of unknown health, unmeasured, as the picker
	// wants).
	Tier int8
	// Scores holds each configured scorer's score, by Scorer.
	Scores [routingpolicy.NumScorers]float64
	// Total is the weighted sum of the scores.
	Total float64
	// Load is the candidate's load for the affinity margin (queue plus
	// in flight per ready pod), and AffinityWithheld whether it was
	// beyond the margin, its affinity scores then 0; both only for a
	// configuration with an affinity scorer and a margin.
	Load             float64
	AffinityWithheld bool
	// Reported is how many leading blocks of the prompt the candidate's
	// EPP reports its servers hold (its prefix summary); -1 when it
	// reports none (it publishes no summary, or its pool metrics are not
	// fresh): its prefix score is this sidecar's own memory alone. Only
	// when Explanation.Reports.
	Reported int32
}

// Explanation is why a pick came out as it did. A caller that wants one
// keeps an Explanation and passes it to Pick, which overwrites it (reusing
// its space); passing nil costs nothing.
type Explanation struct {
	Config   string
	Scorers  []routingpolicy.WeightedScorer
	Clusters []ClusterExplanation
	// Yields: the affinity margin applied (Load and AffinityWithheld).
	Yields bool
	// Home is the lead decision of home placement (HomeNone without a home
	// bound), the request's home and whether it took the request; its Home
	// is "" without a home bound or without a prompt block.
	Home HomeDecision
	// LastResort: the kept candidates are ejected ones, kept because the
	// filters kept no other (Request.LastResort).
	LastResort bool
	// Reports: the prefix scores read the candidates' EPPs' prefix
	// summaries (ClusterExplanation.Reported).
	Reports bool
}

func (e *Explanation) reset(p *Pipeline, cands []Candidate) {
	e.Config, e.Scorers, e.Yields, e.Home, e.LastResort, e.Reports = p.cfg.Name, p.cfg.Scorers, p.yields, HomeDecision{}, false, false
	e.Clusters = e.Clusters[:0]
	for i := range cands {
		e.Clusters = append(e.Clusters, ClusterExplanation{Name: cands[i].Name})
	}
}

func (e *Explanation) fill(slots []slot) {
	for i := range slots {
		e.Clusters[i].Verdict, e.Clusters[i].Tier, e.Clusters[i].Total = slots[i].verdict, slots[i].tier, slots[i].total
		e.Clusters[i].Load, e.Clusters[i].AffinityWithheld = slots[i].busy, slots[i].withheld
		e.Clusters[i].Reported = slots[i].reported
	}
}

// String is the explanation on one line, for a debug log or a response
// header: the configuration, then per candidate its verdict, tier, each
// scorer's score and the total, and with an affinity margin its load and
// whether its affinity was withheld. With home placement it says first
// the lead decision ("home-outcome", HomeOutcome), then for a request with
// a home the home, its load and bound, "new" for a key not served yet,
// "capacities-unknown" when the candidates counted alike, the home's
// scraped queue per server ("home-queue", when measured); for a loaded
// home, how far its queue is above the least queued candidate's
// ("home-wait", the wait a move saves) and which term of the cost of
// leaving decided
// ("cost-won=prefill": the home kept the request, having no wait to save;
// "wait": it left; "unknown": the bound decided, the queue unmeasured),
// "queued" when the queue made the home loaded; for a home with a request
// overdue, how long it has awaited its first byte and how long it was due
// within ("home-awaited", "home-due") and "overdue"; "left" when the request
// went elsewhere and "second=<name>" when that was its key's second home.
// Where the prefix scores read the EPPs' prefix summaries, each kept
// candidate says how many of the prompt's blocks its EPP reports held
// ("reported=<n>", or "reported=none" for an EPP that publishes none), such
// as
//
//	PrefixAffinity home-outcome=queued,home=b,home-load=2,home-bound=3,home-queue=3,home-wait=3,cost-won=wait,queued,left a:kept,tier=0,load=0,prefix-cache=0,in-flight=1,total=1 b:kept,...
func (e *Explanation) String() string {
	var b strings.Builder
	b.WriteString(e.Config)
	if e.LastResort {
		b.WriteString(" last-resort=ejected")
	}
	if e.Home.Outcome != HomeNone {
		b.WriteString(" home-outcome=")
		b.WriteString(e.Home.Outcome.String())
	}
	if h := e.Home; h.Home != "" {
		b.WriteString(",home=")
		b.WriteString(h.Home)
		b.WriteString(",home-load=")
		b.WriteString(strconv.FormatFloat(h.Load, 'g', 4, 64))
		b.WriteString(",home-bound=")
		b.WriteString(strconv.FormatFloat(h.Bound, 'g', 4, 64))
		writeHomeFlags(&b, h)
	}
	for _, c := range e.Clusters {
		b.WriteByte(' ')
		b.WriteString(c.Name)
		b.WriteByte(':')
		b.WriteString(c.Verdict.String())
		if c.Verdict != Kept {
			continue
		}
		b.WriteString(",tier=")
		b.WriteString(strconv.Itoa(int(c.Tier)))
		if e.Yields {
			b.WriteString(",load=")
			b.WriteString(strconv.FormatFloat(c.Load, 'g', 3, 64))
			if c.AffinityWithheld {
				b.WriteString(",affinity-withheld")
			}
		}
		for _, s := range e.Scorers {
			b.WriteByte(',')
			b.WriteString(s.Scorer.String())
			b.WriteByte('=')
			b.WriteString(strconv.FormatFloat(c.Scores[s.Scorer], 'g', 3, 64))
		}
		if len(e.Scorers) > 0 {
			b.WriteString(",total=")
			b.WriteString(strconv.FormatFloat(c.Total, 'g', 4, 64))
		}
		if e.Reports && c.Reported < 0 {
			b.WriteString(",reported=none")
		} else if e.Reports {
			b.WriteString(",reported=")
			b.WriteString(strconv.Itoa(int(c.Reported)))
		}
	}
	return b.String()
}

// writeHomeFlags writes what the explanation says of the request's home
// beyond its load and bound.
func writeHomeFlags(b *strings.Builder, h HomeDecision) {
	if h.New {
		b.WriteString(",new")
	}
	if h.Alike {
		b.WriteString(",capacities-unknown")
	}
	if h.Queue >= 0 {
		b.WriteString(",home-queue=")
		b.WriteString(strconv.FormatFloat(h.Queue, 'g', 3, 64))
	}
	if h.Won != CostNone {
		if h.Wait >= 0 {
			b.WriteString(",home-wait=")
			b.WriteString(strconv.FormatFloat(h.Wait, 'g', 3, 64))
		}
		b.WriteString(",cost-won=")
		b.WriteString(h.Won.String())
	}
	if h.Queued {
		b.WriteString(",queued")
	}
	if h.Filled {
		b.WriteString(",filled")
	}
	if h.Overdue {
		b.WriteString(",home-awaited=")
		b.WriteString(h.Awaited.Round(time.Millisecond).String())
		b.WriteString(",home-due=")
		b.WriteString(h.Due.Round(time.Millisecond).String())
		b.WriteString(",overdue")
	}
	if h.Left {
		b.WriteString(",left")
	}
	if h.Second != "" {
		b.WriteString(",second=")
		b.WriteString(h.Second)
	}
}
