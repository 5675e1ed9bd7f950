package benchrouting

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/test/benchrouting/workload"
	"github.com/mci-dev/mci/test/simulator"
)

// outcome is what one request of the workload met.
type outcome struct {
	// cluster served it (from the simulator's instance header); "" when
	// none did.
	cluster string
	// code is the HTTP status; 0 when the request failed or timed out
	// before one.
	code int
	// complete: the stream ended with [DONE].
	complete bool
	// ttft is from the request's scheduled time to its first streamed
	// token; e2e to its last byte.
	ttft, e2e    time.Duration
	promptTokens int
	cachedTokens int
	// afterSaturation: the saturated-cluster workload sent it to the
	// saturated cluster after that one filled (its scheduled time at or
	// after the saturation's start), where it waits for a batch place
	// until the run's background requests end.
	afterSaturation bool
	// entry is where the request entered (workload.Request.Entry).
	entry string
}

// loadSample is the load of each cluster at one instant: requests
// running and waiting on its servers.
type loadSample struct {
	running, waiting map[string]int
}

// runResult is one policy's run of one workload.
type runResult struct {
	outcomes []outcome
	// active is from the first request's scheduled time to the last
	// answer.
	active  time.Duration
	samples []loadSample
	// hitTokens and queryTokens are the simulators' prefix cache counters
	// over the run.
	hitTokens, queryTokens uint64
	// homes counts the sidecars' home decisions of the run by result
	// (homeResults); nil for a reference routing.
	homes map[string]float64
	// summaryBytes are the bytes of prefix summaries the exporting
	// clusters' EPPs sent during the run, summaryLargest the largest
	// summary one of them built, and summaryPools how many EPPs there are.
	summaryBytes, summaryLargest float64
	summaryPools                 int
}

// runPolicy sends reqs through policy's router on their schedule and
// measures them, with every server's cache emptied first. Requests that
// enter elsewhere (workload.Request.Entry) go their own way
// (entryRoutesFor).
func runPolicy(ctx context.Context, e *env, w spec, policy string, reqs []workload.Request) (*runResult, error) {
	rt, stop, err := e.routerFor(ctx, policy)
	if err != nil {
		return nil, err
	}
	defer stop()
	routes, err := e.entryRoutesFor(ctx, w, policy, rt)
	if err != nil {
		return nil, err
	}
	if err := e.resetCaches(ctx); err != nil {
		return nil, err
	}
	before, err := e.cacheStats(ctx)
	if err != nil {
		return nil, err
	}
	hosts := routes.hosts
	homesBefore, err := homeDecisions(ctx, hosts)
	if err != nil {
		return nil, err
	}
	summariesBefore, err := e.prefixSummaries(ctx)
	if err != nil {
		return nil, err
	}
	res := &runResult{outcomes: make([]outcome, len(reqs))}
	samplerCtx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	samplerDone := make(chan []loadSample, 1)
	go func() { samplerDone <- sample(samplerCtx, e) }()

	start := time.Now()
	arrivalsCtx, arrivalsOver := context.WithCancel(ctx)
	defer arrivalsOver()
	var saturating sync.WaitGroup
	if w.Saturate {
		saturating.Go(func() { saturate(arrivalsCtx, e, start.Add(saturationStart(e.cfg))) })
	}
	var wg sync.WaitGroup
	var lastMu sync.Mutex
	last := start
	for i, r := range reqs {
		at := start.Add(r.At)
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		wg.Go(func() {
			res.outcomes[i] = send(ctx, e.cfg.RequestTimeout, routes.of(r.Entry), e.dp.Model, r, at)
			res.outcomes[i].entry = r.Entry
			res.outcomes[i].afterSaturation = w.Saturate &&
				res.outcomes[i].cluster == saturatedCluster && r.At >= saturationStart(e.cfg)
			lastMu.Lock()
			if now := time.Now(); now.After(last) {
				last = now
			}
			lastMu.Unlock()
		})
	}
	arrivalsOver()
	wg.Wait()
	saturating.Wait()
	res.active = last.Sub(start)
	stopSampler()
	res.samples = <-samplerDone

	after, err := e.cacheStats(ctx)
	if err != nil {
		return nil, err
	}
	for url, a := range after {
		res.hitTokens += a.HitTokens - before[url].HitTokens
		res.queryTokens += a.QueryTokens - before[url].QueryTokens
	}
	summariesAfter, err := e.prefixSummaries(ctx)
	if err != nil {
		return nil, err
	}
	res.summaryBytes = summariesAfter.sent - summariesBefore.sent
	res.summaryLargest, res.summaryPools = summariesAfter.largest, summariesAfter.pools
	if len(hosts) > 0 {
		homesAfter, err := homeDecisions(ctx, hosts)
		if err != nil {
			return nil, err
		}
		res.homes = map[string]float64{}
		for _, r := range homeResults {
			res.homes[r] = homesAfter[r] - homesBefore[r]
		}
	}
	return res, nil
}

// chatBody is the request's body: an OpenAI chat completion, streamed,
// with the usage in the last chunk.
func chatBody(model string, r workload.Request) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "messages": r.Messages, "max_tokens": r.MaxTokens,
		"stream": true, "stream_options": map[string]any{"include_usage": true},
	})
	return b
}

var benchClient = &http.Client{Transport: loopbackTransport()}

// send sends one request at its time and reads its stream.
func send(ctx context.Context, timeout time.Duration, rt router, model string, r workload.Request, at time.Time) outcome {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := outcome{promptTokens: r.PromptTokens()}
	body := chatBody(model, r)
	base, done, err := rt.route(ctx, body)
	if err != nil {
		return out
	}
	defer done()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := benchClient.Do(req)
	if err != nil {
		return out
	}
	defer func() { _ = resp.Body.Close() }()
	out.code = resp.StatusCode
	out.cluster, _, _ = strings.Cut(resp.Header.Get(simulator.InstanceHeader), "/")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		out.e2e = time.Since(at)
		return out
	}
	out.complete, out.cachedTokens, out.ttft = readStream(resp.Body, at)
	out.e2e = time.Since(at)
	return out
}

// readStream reads server-sent events until [DONE]: the time of the first
// content chunk and the cached tokens of the usage chunk.
func readStream(body io.Reader, at time.Time) (done bool, cached int, ttft time.Duration) {
	rd := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := rd.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: ")); ok {
			if string(data) == "[DONE]" {
				return true, cached, ttft
			}
			var chunk struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *struct {
					Details *struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			if json.Unmarshal(data, &chunk) == nil {
				if len(chunk.Choices) > 0 && ttft == 0 {
					ttft = time.Since(at)
				}
				if chunk.Usage != nil && chunk.Usage.Details != nil {
					cached = chunk.Usage.Details.Cached
				}
			}
		}
		if err != nil {
			return false, cached, ttft
		}
	}
}

// sample reads every server's load each SampleEvery until ctx ends.
func sample(ctx context.Context, e *env) []loadSample {
	var out []loadSample
	servers := e.allServers()
	tick := time.NewTicker(e.cfg.SampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		s := loadSample{running: map[string]int{}, waiting: map[string]int{}}
		ok := true
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, srv := range servers {
			wg.Go(func() {
				var m simulator.Metrics
				err := call(ctx, http.MethodGet, srv.url+"/admin/load", nil, &m)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					ok = false
					return
				}
				s.running[srv.cluster] += m.Running
				s.waiting[srv.cluster] += m.Waiting
			})
		}
		wg.Wait()
		if ok {
			out = append(out, s)
		}
	}
}

// saturationStart is when, from the start of a run of the saturated-cluster
// workload, the background requests start to fill saturatedCluster.
func saturationStart(c config) time.Duration { return c.RunDuration / 2 }

// saturate fills every batch place of saturatedCluster's servers from
// from on, with long requests sent straight to them (not measured), until
// ctx ends: the cluster's own traffic that no router sees.
func saturate(ctx context.Context, e *env, from time.Time) {
	select {
	case <-time.After(time.Until(from)):
	case <-ctx.Done():
		return
	}
	logf("saturating %s", saturatedCluster)
	// Each request runs about a minute at most; cancelled at the end.
	tokens := min(4096, int(time.Minute/max(e.cfg.Cost.DecodePerToken, time.Millisecond)))
	body := fmt.Appendf(nil, `{"model":%q,"prompt":"background","max_tokens":%d}`, e.dp.Model, tokens)
	var wg sync.WaitGroup
	for _, url := range e.servers[saturatedCluster] {
		for range e.shape.batch {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
					if err != nil {
						return
					}
					resp, err := benchClient.Do(req)
					if err != nil {
						if !errors.Is(err, context.Canceled) {
							time.Sleep(100 * time.Millisecond) // paces the load's retries
						}
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
		}
	}
	wg.Wait()
}
