package envoyclient

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Target is one ext_proc server under load, named for the report.
type Target struct {
	Name   string
	Client *Client
}

// LoadOptions say how hard and how long Load drives its targets.
type LoadOptions struct {
	// Request is what every round trip sends.
	Request Request
	// Rate is the round trips per second sent to the target of the round.
	Rate int
	// Duration is each target's total sending time.
	Duration time.Duration
	// Rounds splits each target's Duration into this many turns, taken in
	// turn (A, B, A, B, ...), so that a noisy neighbour on a shared machine
	// weighs on every target alike. Zero or one: a single turn each.
	Rounds int
	// MaxInFlight bounds the round trips in flight; a round trip due while
	// that many are pending waits, and the wait counts in its latency.
	// Zero: 256.
	MaxInFlight int
	// Timeout bounds each round trip. Zero: 5s.
	Timeout time.Duration
	// Check judges an answer; nil counts every answer with a destination as
	// a success.
	Check func(*Result) error
}

// LoadResult is what one target did under Load.
type LoadResult struct {
	Name string
	// Latencies, sorted, of the successful round trips, each measured from
	// the moment it was due to be sent (open loop), so a stall of the
	// server shows in the figures instead of slowing the sender down, to
	// the moment the answer was whole (the stream's close, which a
	// gateway does after passing the answer on, not included).
	Latencies []time.Duration
	// Failed counts round trips that errored or failed Check; the first
	// failure is kept in FirstError.
	Failed     int
	FirstError error
	// Backlogged counts round trips that had to wait for MaxInFlight.
	Backlogged int
	// Sent is the number of round trips sent, and Elapsed the time spent
	// sending them, so Sent/Elapsed is the rate achieved.
	Sent    int
	Elapsed time.Duration
}

// Percentile returns the latency below which a fraction p of the
// successful round trips fell; 0 when there were none.
func (r *LoadResult) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[min(int(p*float64(len(r.Latencies))), len(r.Latencies)-1)]
}

// Rate returns the round trips per second achieved.
func (r *LoadResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

// String summarises the result in one line.
func (r *LoadResult) String() string {
	s := fmt.Sprintf("%s: %d sent at %.0f/s, p50 %v, p90 %v, p99 %v, p99.9 %v, max %v, %d failed, %d backlogged",
		r.Name, r.Sent, r.Rate(), r.Percentile(.5), r.Percentile(.9), r.Percentile(.99), r.Percentile(.999),
		r.Percentile(1), r.Failed, r.Backlogged)
	if r.FirstError != nil {
		s += fmt.Sprintf(" (first: %v)", r.FirstError)
	}
	return s
}

// Load sends opts.Request to the targets at a fixed rate, one target at a
// time in interleaved turns, and returns one result per target, in the
// order given. It returns early, with what it measured, when ctx ends.
func Load(ctx context.Context, opts LoadOptions, targets ...Target) []*LoadResult {
	rounds := max(opts.Rounds, 1)
	inFlight := opts.MaxInFlight
	if inFlight <= 0 {
		inFlight = 256
	}
	timeout := cmp.Or(opts.Timeout, 5*time.Second)
	check := checkOr(opts.Check)
	perTurn := int(float64(opts.Rate) * (opts.Duration / time.Duration(rounds)).Seconds())
	interval := time.Second / time.Duration(max(opts.Rate, 1))
	slots := make(chan struct{}, inFlight)
	return inTurns(ctx, rounds, targets, func(t Target, r *LoadResult, record func(error, time.Duration)) {
		var wg sync.WaitGroup
		start := time.Now()
		for n := range perTurn {
			due := start.Add(time.Duration(n) * interval)
			time.Sleep(time.Until(due))
			select {
			case slots <- struct{}{}:
			default:
				r.Backlogged++
				slots <- struct{}{}
			}
			wg.Go(func() {
				defer func() { <-slots }()
				rctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				var answered time.Time
				res, err := t.Client.do(rctx, opts.Request, &answered)
				if err == nil {
					err = check(res)
				}
				record(err, answered.Sub(due))
			})
		}
		wg.Wait()
	})
}

// inTurns runs turn for each target in turn, rounds times, each turn's time
// added to the target's Elapsed, and returns the results, their latencies
// sorted. A turn calls record, safe for concurrent use, once for each round
// trip it sends. It returns early, with what was measured, when ctx ends.
func inTurns(ctx context.Context, rounds int, targets []Target, turn func(t Target, r *LoadResult, record func(error, time.Duration))) []*LoadResult {
	results := make([]*LoadResult, len(targets))
	for i, t := range targets {
		results[i] = &LoadResult{Name: t.Name}
	}
	defer func() {
		for _, r := range results {
			slices.Sort(r.Latencies)
		}
	}()
	for range rounds {
		for i, t := range targets {
			if ctx.Err() != nil {
				return results
			}
			r := results[i]
			var mu sync.Mutex
			start := time.Now()
			turn(t, r, func(err error, latency time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				r.Sent++
				r.record(err, latency)
			})
			r.Elapsed += time.Since(start)
		}
	}
	return results
}

// record counts a round trip that ended with err, or took latency.
func (r *LoadResult) record(err error, latency time.Duration) {
	if err != nil {
		r.Failed++
		if r.FirstError == nil {
			r.FirstError = err
		}
		return
	}
	r.Latencies = append(r.Latencies, latency)
}

// checkOr is check, or routed when nil.
func checkOr(check func(*Result) error) func(*Result) error {
	if check == nil {
		return routed
	}
	return check
}

// routed accepts every answer with a destination.
func routed(res *Result) error {
	if res.Immediate != nil {
		return fmt.Errorf("immediate response %d: %s", res.Immediate.StatusCode, res.Immediate.Body)
	}
	if res.Destination == "" {
		return fmt.Errorf("no destination")
	}
	return nil
}

// SaturateOptions say how Saturate drives its targets.
type SaturateOptions struct {
	// Request is what every round trip sends.
	Request Request
	// Clients is how many round trips are kept in flight: each client
	// sends its next as soon as its last is answered (a closed loop).
	Clients int
	// Duration is each target's total sending time, in Rounds turns taken
	// in turn as Load takes them.
	Duration time.Duration
	Rounds   int
	// Timeout bounds each round trip. Zero: 5s.
	Timeout time.Duration
	// Check judges an answer; nil counts every answer with a destination as
	// a success.
	Check func(*Result) error
}

// Saturate keeps opts.Clients round trips in flight on one target at a time,
// in interleaved turns, and returns one result per target, in the order
// given, Rate the throughput the target sustained (a round trip's latency
// is from its send). On a machine that the target's servers and this
// process share, that is the throughput their CPU allows. It returns early
// when ctx ends.
func Saturate(ctx context.Context, opts SaturateOptions, targets ...Target) []*LoadResult {
	rounds, clients := max(opts.Rounds, 1), max(opts.Clients, 1)
	timeout := cmp.Or(opts.Timeout, 5*time.Second)
	check := checkOr(opts.Check)
	turn := opts.Duration / time.Duration(rounds)
	return inTurns(ctx, rounds, targets, func(t Target, _ *LoadResult, record func(error, time.Duration)) {
		var wg sync.WaitGroup
		end := time.Now().Add(turn)
		for range clients {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					sent := time.Now()
					rctx, cancel := context.WithTimeout(ctx, timeout)
					var answered time.Time
					res, err := t.Client.do(rctx, opts.Request, &answered)
					cancel()
					if err == nil {
						err = check(res)
					}
					record(err, answered.Sub(sent))
				}
			})
		}
		wg.Wait()
	})
}
