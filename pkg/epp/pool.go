package epp

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/scheduling"
)

// Endpoint is one model server of the pool: a candidate.
type Endpoint struct {
	// Name identifies the endpoint in logs and metrics: the pod name, or its
	// address when there is no pod.
	Name string
	// Address is "ip:port", where inference requests go.
	Address string
	// Models are the model names the server answers to, from its seed 002
	// /metadata (base model and LoRA adapters); nil when it does not say,
	// and it is then a candidate for any model.
	Models []string
	// BaseModel is the base model its metadata names, "" when unknown.
	BaseModel string
}

// MetricsURL is where the endpoint's vLLM metrics are scraped: /metrics on
// its inference port, as vLLM serves them.
func (e Endpoint) MetricsURL() string { return "http://" + e.Address + "/metrics" }

// MetricsSource has the latest metrics of model servers by metrics URL;
// metrics.Scraper is one. Get returns nil for a server never scraped.
type MetricsSource interface {
	Get(url string) *scheduling.Metrics
}

// ScrapeTargets is told which metrics URLs to scrape; metrics.Scraper is one.
type ScrapeTargets interface {
	SetTargets(urls []string) error
}

// Pool is the current set of candidate endpoints of one InferencePool and
// their metrics. The set is an immutable snapshot swapped on change, so a
// request reads it without locks. Safe for concurrent use.
type Pool struct {
	name    string
	metrics MetricsSource
	targets ScrapeTargets

	snap atomic.Pointer[snapshot]
	// synced is closed by the first SetEndpoints: from then on the set is
	// the pool's, not just empty because nothing is known yet.
	synced     chan struct{}
	syncedOnce sync.Once
}

// NewPool returns an empty, not yet synced pool named name (the
// InferencePool's name, for metrics). metrics gives the endpoints' metrics;
// targets, when not nil, is kept scraping exactly the current endpoints.
func NewPool(name string, metrics MetricsSource, targets ScrapeTargets) *Pool {
	p := &Pool{name: name, metrics: metrics, targets: targets, synced: make(chan struct{})}
	p.snap.Store(&snapshot{})
	return p
}

// Name returns the pool's name.
func (p *Pool) Name() string { return p.name }

// SetEndpoints replaces the candidates and marks the pool synced. Endpoints
// are kept in address order, one per address (the first of duplicates).
func (p *Pool) SetEndpoints(eps []Endpoint) error {
	eps = slices.Clone(eps)
	slices.SortStableFunc(eps, func(a, b Endpoint) int { return cmp.Compare(a.Address, b.Address) })
	eps = slices.CompactFunc(eps, func(a, b Endpoint) bool { return a.Address == b.Address })
	for _, e := range eps {
		if _, _, err := net.SplitHostPort(e.Address); err != nil {
			return fmt.Errorf("endpoint %s: address %q is not ip:port: %w", e.Name, e.Address, err)
		}
	}
	snap := &snapshot{endpoints: eps, urls: make([]string, len(eps)), models: make([]sets.Set[string], len(eps)), bases: sets.New[string]()}
	for i, e := range eps {
		snap.urls[i] = e.MetricsURL()
		if e.Models != nil {
			snap.models[i] = sets.New(e.Models...)
		}
		if e.BaseModel != "" {
			snap.bases.Insert(e.BaseModel)
		}
	}
	var err error
	if p.targets != nil {
		err = p.targets.SetTargets(snap.urls)
	}
	p.snap.Store(snap)
	p.syncedOnce.Do(func() { close(p.synced) })
	return err
}

// snapshot is one immutable state of the pool: the endpoints and, parallel
// to them, their metrics URLs and the models they serve (nil: any), built
// once, not on every request; bases are the base models the endpoints'
// metadata names.
type snapshot struct {
	endpoints []Endpoint
	urls      []string
	models    []sets.Set[string]
	bases     sets.Set[string]
}

// serves reports whether the snapshot's endpoint i serves model: it lists
// the model, or lists none.
func (s *snapshot) serves(i int, model string) bool {
	return s.models[i] == nil || s.models[i].Has(model)
}

// Endpoints returns the current candidates. The slice must not be modified.
func (p *Pool) Endpoints() []Endpoint { return p.snap.Load().endpoints }

// Synced is closed once the pool has had its first set of endpoints.
func (p *Pool) Synced() <-chan struct{} { return p.synced }

// Metrics returns the latest metrics of an endpoint, nil when unknown.
func (p *Pool) Metrics(e Endpoint) *scheduling.Metrics {
	if p.metrics == nil {
		return nil
	}
	return p.metrics.Get(e.MetricsURL())
}

// metricsOf returns the latest metrics of the snapshot's endpoint i, nil
// when unknown.
func (p *Pool) metricsOf(s *snapshot, i int) *scheduling.Metrics {
	if p.metrics == nil {
		return nil
	}
	return p.metrics.Get(s.urls[i])
}
