package epp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/discovery"
)

// What the EPP knows of a ready instance's seed 002 /metadata: the values
// of mci_epp_model_server_instances{metadata}.
const (
	// MetadataServed: the instance's metadata names its models; it is a
	// candidate for those only.
	MetadataServed = "served"
	// MetadataAbsent: the instance serves no /metadata (404) or its
	// metadata names no model; it is a candidate for any model, as every
	// instance was before seed 002.
	MetadataAbsent = "absent"
	// MetadataStale: the last fetch failed; the last valid metadata is
	// kept and the instance stays a candidate for its models.
	MetadataStale = "stale"
	// MetadataUnreachable: no fetch has succeeded yet; not a candidate.
	MetadataUnreachable = "unreachable"
	// MetadataInvalid: the metadata is not of the seed's shape; not a
	// candidate until it is.
	MetadataInvalid = "invalid"
)

var metadataStates = []string{MetadataServed, MetadataAbsent, MetadataStale, MetadataUnreachable, MetadataInvalid}

// metadataFetchTimeout bounds one /metadata request: a hung model server
// must not hold up the recomputation that removes another one.
const metadataFetchTimeout = 3 * time.Second

// metadataFetchers is how many /metadata requests run at once.
const metadataFetchers = 8

// instance is one ready instance and what its metadata says.
type instance struct {
	discovery.Instance
	state  string
	models *discovery.ServedModels // the last valid, nil when none or absent
	// fetchedURL and fetchedAt are the last fetch's; failed is whether it
	// failed (so the next recomputation fetches again).
	fetchedURL string
	fetchedAt  time.Time
	failed     bool
}

// counts reports whether the instance is a candidate.
func (in *instance) counts() bool {
	return in.state == MetadataServed || in.state == MetadataAbsent || in.state == MetadataStale
}

// instanceSet is the set the scheduler reads, kept by the diff events of
// the ready set and the instances' /metadata. Used by one recomputation at
// a time.
type instanceSet struct {
	// fetch gets an instance's metadata; discovery.Metadata.
	fetch   func(ctx context.Context, client *http.Client, baseURL string) (map[string]any, error)
	client  *http.Client
	refresh time.Duration
	now     func() time.Time
	logger  klog.Logger
	gauge   *prometheus.GaugeVec

	instances map[string]*instance
}

func newInstanceSet(refresh time.Duration, client *http.Client) *instanceSet {
	return &instanceSet{
		fetch:   discovery.Metadata,
		client:  client,
		refresh: refresh,
		now:     time.Now,
		logger:  klog.Background(),
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mci_epp_model_server_instances",
			Help: "Ready model-server instances by what their seed 002 /metadata says: served (names its models), absent (no /metadata or no model: any model), stale (last fetch failed, last valid kept), unreachable, invalid and no-pod-ip (its targetRef Pod has no address) are not candidates.",
		}, []string{"metadata"}),
		instances: map[string]*instance{},
	}
}

// apply applies the ready set's diff events: an added instance is
// recorded with its metadata to fetch, a removed one forgotten.
func (s *instanceSet) apply(events []discovery.Event) {
	for _, ev := range events {
		switch ev.Type {
		case discovery.InstanceAdded:
			s.instances[ev.Instance.ID] = &instance{Instance: ev.Instance, state: MetadataUnreachable}
			s.logger.V(2).Info("Model server instance added", "instance", ev.Instance.ID, "address", ev.Instance.Address)
		case discovery.InstanceRemoved:
			delete(s.instances, ev.Instance.ID)
			s.logger.V(2).Info("Model server instance removed", "instance", ev.Instance.ID)
		}
	}
}

// address is the instance's "ip:port" on port.
func address(in discovery.Instance, port int32) string {
	return net.JoinHostPort(in.Address, strconv.Itoa(int(port)))
}

// refreshMetadata fetches the /metadata of the instances that need it (new,
// failed last time, on a new address or port, or older than the refresh
// interval), in parallel, and updates their state. It returns an error
// naming the instances whose fetch failed, so that the caller retries them
// with backoff.
func (s *instanceSet) refreshMetadata(ctx context.Context, port int32) error {
	now := s.now()
	var due []*instance
	for _, in := range s.instances {
		url := "http://" + address(in.Instance, port)
		if in.failed || in.fetchedURL != url || now.Sub(in.fetchedAt) >= s.refresh {
			in.fetchedURL = url
			due = append(due, in)
		}
	}
	results := make([]fetchResult, len(due))
	workqueue.ParallelizeUntil(ctx, metadataFetchers, len(due), func(i int) {
		fctx, cancel := context.WithTimeout(ctx, metadataFetchTimeout)
		defer cancel()
		md, err := s.fetch(fctx, s.client, due[i].fetchedURL)
		results[i] = fetchResult{md: md, err: err}
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var failed []string
	for i, in := range due {
		in.fetchedAt = now
		if !s.record(in, results[i]) {
			failed = append(failed, in.ID)
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return fmt.Errorf("fetching the /metadata of model servers %s failed; retrying", strings.Join(failed, ", "))
	}
	return nil
}

type fetchResult struct {
	md  map[string]any
	err error
}

// record applies one fetch's result to the instance, logging once each
// change of its state, its models, or whether its fetches fail; it reports
// whether the fetch succeeded.
func (s *instanceSet) record(in *instance, r fetchResult) bool {
	state, models, err := in.state, in.models, r.err
	if err == nil {
		models, err = discovery.ParseServedModels(r.md)
	}
	switch {
	case err == nil && models == nil, errors.Is(err, discovery.ErrNoMetadata):
		state, models, err = MetadataAbsent, nil, nil
	case err == nil:
		state = MetadataServed
	case errors.Is(err, discovery.ErrInvalidMetadata):
		state, models = MetadataInvalid, nil
	case in.state == MetadataServed || in.state == MetadataStale:
		state = MetadataStale // keep the last valid models
	case in.state == MetadataAbsent:
		// Nothing said before, nothing now: it stays a candidate for any
		// model; the failure is logged below, once.
	default:
		state = MetadataUnreachable
	}
	wasFailing := in.failed
	in.failed = err != nil
	if state != in.state || !slices.Equal(names(models), names(in.models)) || in.failed != wasFailing {
		kv := []any{"instance", in.ID, "url", in.fetchedURL, "metadata", state, "models", names(models), "candidate", (&instance{state: state}).counts()}
		if err != nil {
			kv = append(kv, "err", err)
		}
		s.logger.Info("Model server metadata changed", kv...)
	}
	in.state, in.models = state, models
	return err == nil
}

func names(m *discovery.ServedModels) []string {
	if m == nil {
		return nil
	}
	return m.Names()
}

// endpoints are the candidates: the instances that count, on port, with
// the models their metadata names. It also sets the state gauge.
func (s *instanceSet) endpoints(port int32) []Endpoint {
	byState := map[string]int{}
	eps := make([]Endpoint, 0, len(s.instances))
	for _, id := range slices.Sorted(maps.Keys(s.instances)) {
		in := s.instances[id]
		byState[in.state]++
		if !in.counts() {
			continue
		}
		ep := Endpoint{Name: in.ID, Address: address(in.Instance, port)}
		if in.models != nil {
			ep.Models, ep.BaseModel = in.models.Names(), in.models.Base
		}
		eps = append(eps, ep)
	}
	for _, st := range metadataStates {
		s.gauge.WithLabelValues(st).Set(float64(byState[st]))
	}
	return eps
}

// clear forgets every instance (the InferencePool is gone).
func (s *instanceSet) clear() { clear(s.instances) }
