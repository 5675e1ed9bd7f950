package soak

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/test/localclusterset"
)

// request is one completion request sent through the gateway.
type request struct {
	Sent time.Time `json:"sent"`
	Done time.Time `json:"done"`
	Code int       `json:"code"`
	// Cluster served it: the cluster part of the simulator's instance ID
	// ("<cluster>/<pod>", X-Simulator-Instance).
	Cluster string `json:"cluster,omitempty"`
	Err     string `json:"error,omitempty"`
	Body    string `json:"body,omitempty"`
	// Model is the model an answered request's response names.
	Model string `json:"model,omitempty"`
	// Route is regionalRoute for a request to the regional route; empty
	// for the data path's own.
	Route string `json:"route,omitempty"`
}

func (r request) failed() bool { return r.Err != "" || r.Code != 200 }

// traffic sends requests at a steady rate, each on its own goroutine (at
// most maxInFlight at once: a request that finds them all busy is counted
// as not sent rather than queued, which would bunch them up later).
type traffic struct {
	dp          *localclusterset.DataPath
	maxInFlight int
	// regional: one request in regionalEvery goes to the regional route.
	regional bool

	mu       sync.Mutex
	requests []request
	notSent  int
}

func (tr *traffic) run(ctx context.Context, rate float64) {
	slots := make(chan struct{}, tr.maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		default:
			tr.mu.Lock()
			tr.notSent++
			tr.mu.Unlock()
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			// Not ctx: a request under way when the soak stops finishes.
			send := tr.dp.Send
			r := request{Sent: time.Now()}
			if tr.regional && n%regionalEvery == regionalEvery-1 {
				send = func(ctx context.Context) (int, string, string, error) { return tr.dp.SendTo(ctx, regionalHost) }
				r.Route = regionalRoute
			}
			code, instance, body, err := send(context.Background())
			r.Done, r.Code = time.Now(), code
			r.Cluster, _, _ = strings.Cut(instance, "/")
			if err != nil {
				r.Err = err.Error()
			}
			if r.failed() && len(body) > 0 {
				// Room for mci-sidecar's refusal of the regional route.
				r.Body = body[:min(len(body), 400)]
			}
			if !r.failed() {
				var answer struct {
					Model string `json:"model"`
				}
				if json.Unmarshal([]byte(body), &answer) != nil || answer.Model == "" {
					answer.Model = "(none: " + body[:min(len(body), 100)] + ")"
				}
				r.Model = answer.Model
			}
			tr.mu.Lock()
			tr.requests = append(tr.requests, r)
			tr.mu.Unlock()
		})
	}
}

func (tr *traffic) snapshot() ([]request, int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]request(nil), tr.requests...), tr.notSent
}
