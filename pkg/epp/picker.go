package epp

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/scheduling"
)

var (
	// ErrNoEndpoints means there is no ready endpoint to pick (in the subset
	// hint, when there is one). The EPP answers 503.
	ErrNoEndpoints = errors.New("no ready model server endpoint")
	// ErrModelNotServed means no ready model server of the pool serves the
	// request's target model, by what their /metadata says. The EPP
	// answers 404.
	ErrModelNotServed = errors.New("no ready model server of the pool serves the model")
)

// Error is a request the EPP refuses, with the HTTP status it answers.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// StatusCode returns the HTTP status the EPP answers for err: the Code of an
// *Error, 500 for anything else.
func StatusCode(err error) int {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return http.StatusInternalServerError
}

// PickerConfig configures a Picker.
type PickerConfig struct {
	// Scheduling are the thresholds of the filter chain.
	Scheduling scheduling.Config
	// MaxFallbacks is how many fallback endpoints follow the primary in the
	// destination, each the scheduler's pick among the endpoints not yet
	// listed. 0 sends the primary alone.
	MaxFallbacks int
	// BaseModels are the names the model servers serve their base model
	// under. A request whose target model is one of them needs no LoRA
	// adapter; any other target model is taken for an adapter's name.
	BaseModels []string
}

// Decision is where one request goes.
type Decision struct {
	// Model is the model the request asked for.
	Model string
	// Listed is whether an InferenceModel or an exact InferenceModelRewrite
	// rule names Model.
	Listed bool
	// TargetModel is the model it is sent for (see Models.Resolve).
	TargetModel string
	// RewrittenBy says what chose TargetModel (Resolution.RewrittenBy).
	RewrittenBy string
	// Criticality of the request.
	Criticality scheduling.Criticality
	// Objective is the InferenceObjective the request named, nil when none
	// (or an unknown one, then UnknownObjective names it).
	Objective        *requestmodel.Objective
	UnknownObjective string
	// FairnessID is the request's flow (DefaultFairnessID when it names
	// none). mci has no flow control: it is logged and left on the request.
	FairnessID string
	// Endpoints are the picked endpoints' addresses, the primary first.
	Endpoints []string
	// PromptBlocks is how many prompt blocks the request has, and
	// PrefixMatched how many leading ones the primary endpoint was taken
	// to hold (the prefix index's guess), for the decision's log.
	PromptBlocks, PrefixMatched int
	// Body is the rewritten body, nil when the body goes on unchanged.
	Body []byte
}

// Picker makes the EPP's decisions: it reads the model of a request body,
// maps it and the request's steering headers through the pool's
// InferenceModels, InferenceObjectives and InferenceModelRewrites
// (Models.Resolve), and schedules it on the pool's endpoints. It knows nothing of gRPC. Safe for concurrent use.
type Picker struct {
	cfg    PickerConfig
	pool   *Pool
	models *requestmodel.Models
	base   sets.Set[string]

	// mu guards the scheduler, which keeps scratch space between decisions,
	// and the random source it shares with the weighted target choice. A
	// decision holds it for about a microsecond (BenchmarkPick), far less
	// than the ext_proc round trip around it, so one guarded scheduler
	// costs less than a pool of them would.
	mu    sync.Mutex
	sched *scheduling.Scheduler
	rand  *rand.Rand

	// prefixes guesses which endpoints hold which prompt prefixes in
	// their prefix cache: where earlier prompts were sent.
	prefixes *promptprefix.Index
	// sent are the prompt blocks sent to the pool, scoped by the model
	// the request named rather than the one it was sent for: what the
	// importing clusters' routers can hash too, as they do not know this
	// EPP's rewrites. The prefix summary is read from it.
	sent *promptprefix.Index
}

// PrefixIndexBlocks is how many prompt blocks (of promptprefix.BlockBytes)
// the picker's prefix index remembers: 16 MiB of prompt text, in a table
// of fixed size allocated at start.
const PrefixIndexBlocks = 1 << 18

// NewPicker returns a picker over pool and models. src drives the weighted
// target choice and the scheduler's tie breaks; nil means a randomly seeded
// source.
func NewPicker(cfg PickerConfig, pool *Pool, models *requestmodel.Models, src rand.Source) (*Picker, error) {
	if err := cfg.Scheduling.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxFallbacks < 0 {
		return nil, fmt.Errorf("max fallbacks %d is negative", cfg.MaxFallbacks)
	}
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	return &Picker{
		cfg:    cfg,
		pool:   pool,
		models: models,
		base:   sets.New(cfg.BaseModels...),
		sched:  scheduling.New(cfg.Scheduling, src),
		rand:   rand.New(src),

		prefixes: promptprefix.NewIndex(PrefixIndexBlocks),
		sent:     promptprefix.NewIndex(2 * promptprefix.MaxSummaryBlocks),
	}, nil
}

// recordSent records the blocks of a prompt sent to the pool under the
// model the request named: those the picker matched with when no rewrite
// changed the model, else hashed again.
func (p *Picker) recordSent(prompt *promptprefix.Prompt, d *Decision, blocks []uint64) {
	if d.TargetModel != d.Model {
		var err error
		if blocks, err = prompt.Blocks(nil, promptprefix.ScopeOfModel(d.Model)); err != nil {
			return
		}
	}
	p.sent.Record(blocks, 1)
}

// PrefixSummary is the prompt prefixes the pool's servers likely hold, as
// one set: the blocks of the prompts most recently sent to any of them
// (at most limit; see promptprefix.Index.Summary), scoped by the model
// each request named (promptprefix.ScopeOfModel).
func (p *Picker) PrefixSummary(limit int) *promptprefix.Summary {
	return p.sent.Summary(limit)
}

// Pick decides where a request with this body and steering headers goes.
// subset, when
// hasSubset, restricts the candidates to the endpoints it lists: "ip:port"
// entries match that endpoint, bare "ip" entries any endpoint on the IP. now
// is the reference time for the metrics' staleness.
//
// Errors are *Error: 400 for a body that is not a JSON object or has no
// model, 503 when no endpoint is ready (or none in the subset), 429 when a
// sheddable request is dropped.
func (p *Picker) Pick(body []byte, h requestmodel.RequestHeaders, subset []string, hasSubset bool, now time.Time) (*Decision, error) {
	b, err := requestmodel.ParseBody(body)
	if err != nil {
		return nil, &Error{Code: http.StatusBadRequest, Err: err}
	}
	d := &Decision{Model: b.Model(), FairnessID: cmp.Or(h.FairnessID, requestmodel.DefaultFairnessID)}
	p.mu.Lock()
	res := p.models.Resolve(d.Model, h, p.rand)
	p.mu.Unlock()
	d.Listed, d.Criticality, d.TargetModel, d.RewrittenBy = res.Listed, res.Criticality, res.TargetModel, res.RewrittenBy
	d.Objective, d.UnknownObjective = res.Objective, res.UnknownObjective

	snap := p.pool.snap.Load()
	ids, err := candidates(snap, d.TargetModel, subset, hasSubset)
	if err != nil {
		return d, err
	}
	cands := make([]*scheduling.Metrics, len(ids))
	for j, i := range ids {
		cands[j] = p.pool.metricsOf(snap, i)
	}

	blocks, match := p.prefixMatch(b.Prompt(), d.TargetModel, snap, ids)
	d.PromptBlocks = len(blocks)
	picked, err := p.schedule(d, ids, cands, match, snap.bases.Has(d.TargetModel), now)
	if err != nil {
		return d, err
	}
	d.Endpoints = make([]string, len(picked))
	for j, i := range picked {
		d.Endpoints[j] = snap.endpoints[i].Address
	}
	if len(blocks) > 0 {
		// The primary will hold the prompt's blocks once it has served it.
		p.prefixes.Record(blocks, promptprefix.ClusterID(d.Endpoints[0]))
		p.recordSent(b.Prompt(), d, blocks)
	}
	if d.TargetModel != d.Model {
		d.Body = b.WithModel(d.TargetModel)
	}
	return d, nil
}

// candidates are the indexes of the snapshot's endpoints a request for
// model may go to: the first filter of the chain keeps the endpoints that
// serve the model (their /metadata lists it, or lists nothing), then the
// subset hint, when there is one, keeps those it names. No endpoint at all
// is 503 (nothing is ready); endpoints of which none serves the model is
// 404, what a model server answers for a model it does not have, so that
// a client asking for the wrong model is told so rather than told to retry;
// endpoints serving it but none in the subset is 503, as the protocol says.
func candidates(snap *snapshot, model string, subset []string, hasSubset bool) ([]int, error) {
	if len(snap.endpoints) == 0 {
		return nil, &Error{Code: http.StatusServiceUnavailable, Err: ErrNoEndpoints}
	}
	var allowed subsetHint
	if hasSubset {
		allowed = newSubset(subset)
	}
	ids := make([]int, 0, len(snap.endpoints))
	serving := 0
	for i, e := range snap.endpoints {
		if !snap.serves(i, model) {
			continue
		}
		serving++
		if !hasSubset || allowed.has(e.Address) {
			ids = append(ids, i)
		}
	}
	switch {
	case serving == 0:
		return nil, &Error{Code: http.StatusNotFound, Err: fmt.Errorf("%w: %q", ErrModelNotServed, model)}
	case len(ids) == 0:
		return nil, &Error{Code: http.StatusServiceUnavailable, Err: fmt.Errorf("%w in the subset hint %v", ErrNoEndpoints, subset)}
	}
	return ids, nil
}

// prefixMatch reads the prompt blocks of a body's prompt (gathered when its
// model was read, so the body is read once), scoped by the model it is
// sent for (each model and adapter has its own prefix cache) as the prefix
// summary's consumers scope them (promptprefix.ScopeOfModel), and how many
// leading ones each candidate endpoint (ids) is taken to hold; nil, nil for
// a body without a prompt.
func (p *Picker) prefixMatch(prompt *promptprefix.Prompt, model string, snap *snapshot, ids []int) ([]uint64, []int) {
	blocks, err := prompt.Blocks(nil, promptprefix.ScopeOfModel(model))
	if err != nil || len(blocks) == 0 {
		return nil, nil
	}
	endpoints := make([]uint32, len(ids))
	for j, i := range ids {
		endpoints[j] = promptprefix.ClusterID(snap.endpoints[i].Address)
	}
	match := make([]int, len(ids))
	p.prefixes.Match(blocks, endpoints, match)
	return blocks, match
}

// schedule picks the endpoints under the lock. ids, cands and match (nil:
// no prefix known) are parallel and consumed: each pick is swapped out of
// them before the next (a fallback) is scheduled among the rest.
func (p *Picker) schedule(d *Decision, ids []int, cands []*scheduling.Metrics, match []int, baseModel bool, now time.Time) ([]int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	req := scheduling.Request{Criticality: d.Criticality, Adapter: d.TargetModel, PrefixMatch: match}
	if baseModel || p.base.Has(d.TargetModel) {
		req.Adapter = ""
	}
	var picked []int
	for len(picked) <= p.cfg.MaxFallbacks && len(cands) > 0 {
		j, err := p.sched.Schedule(req, cands, now)
		if err != nil {
			if len(picked) > 0 {
				// No fallback left that the policy accepts.
				break
			}
			switch {
			case errors.Is(err, scheduling.ErrDropped):
				return nil, &Error{Code: http.StatusTooManyRequests, Err: err}
			case errors.Is(err, scheduling.ErrNoCandidates):
				return nil, &Error{Code: http.StatusServiceUnavailable, Err: fmt.Errorf("%w: %w", ErrNoEndpoints, err)}
			default:
				return nil, &Error{Code: http.StatusInternalServerError, Err: err}
			}
		}
		if len(picked) == 0 && req.PrefixMatch != nil {
			d.PrefixMatched = req.PrefixMatch[j]
		}
		picked = append(picked, ids[j])
		last := len(cands) - 1
		ids[j], cands[j] = ids[last], cands[last]
		ids, cands = ids[:last], cands[:last]
		if req.PrefixMatch != nil {
			req.PrefixMatch[j] = req.PrefixMatch[last]
			req.PrefixMatch = req.PrefixMatch[:last]
		}
	}
	return picked, nil
}

// subsetHint is a parsed subset hint.
type subsetHint struct {
	addrs, hosts sets.Set[string]
}

func newSubset(entries []string) subsetHint {
	s := subsetHint{addrs: sets.New[string](), hosts: sets.New[string]()}
	for _, e := range entries {
		if _, _, err := net.SplitHostPort(e); err == nil {
			s.addrs.Insert(e)
		} else {
			s.hosts.Insert(e)
		}
	}
	return s
}

func (s subsetHint) has(addr string) bool {
	if s.addrs.Has(addr) {
		return true
	}
	if s.hosts.Len() == 0 {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	return err == nil && s.hosts.Has(host)
}
