package workload

import (
	"fmt"
	"time"
)

// Cost is what a request costs a model server, as the simulator's cost
// model charges it (test/simulator.CostModel): Base plus PrefillPerToken
// per uncached prompt token to the first token, DecodePerToken per further
// output token, holding one of the server's batch places throughout.
type Cost struct {
	Base, PrefillPerToken, DecodePerToken time.Duration
}

// ServiceTime is the mean time a request of reqs holds a batch place when
// no prompt token is cached: the capacity every routing can count on,
// whatever it does for cache reuse.
func ServiceTime(reqs []Request, c Cost) time.Duration {
	if len(reqs) == 0 {
		return 0
	}
	var total time.Duration
	for _, r := range reqs {
		total += c.Base + time.Duration(r.PromptTokens())*c.PrefillPerToken + time.Duration(r.MaxTokens-1)*c.DecodePerToken
	}
	return total / time.Duration(len(reqs))
}

// Capacity is how many requests of reqs per second slots batch places (of
// all the servers) complete with no prompt token cached.
func Capacity(reqs []Request, c Cost, slots int) float64 {
	s := ServiceTime(reqs, c)
	if s <= 0 || slots <= 0 {
		return 0
	}
	return float64(slots) / s.Seconds()
}

// Calibrate sets p's rate so that its workload loads slots batch places to
// load (0.7: 70%) of their capacity, and returns the profile and that
// capacity. A load past 1 (up to 2) offers more than the servers complete
// without cache hits: past their saturation for a routing that reuses
// nothing. The requests' lengths depend a little on the rate (more
// arrivals, longer conversations), so it iterates to a fixed point.
func Calibrate(p Profile, c Cost, slots int, load float64) (Profile, float64, error) {
	if !(load > 0 && load <= 2) {
		return p, 0, fmt.Errorf("workload: load %v is not in (0, 2]", load)
	}
	if p.Rate <= 0 {
		p.Rate = 1
	}
	var capacity float64
	for range 4 {
		reqs, err := Generate(p)
		if err != nil {
			return p, 0, err
		}
		if capacity = Capacity(reqs, c, slots); capacity <= 0 {
			return p, 0, fmt.Errorf("workload: no capacity: %d batch places, cost %+v", slots, c)
		}
		p.Rate = load * capacity
	}
	return p, capacity, nil
}
