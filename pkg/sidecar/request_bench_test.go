package sidecar

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/envoyclient"
)

// BenchmarkSidecarRequest is one request at a time through the sidecar,
// for what the sidecar itself costs per request: its CPU and allocations.
// The gateway is envoyclient's double in this process; the EPP is mci-epp
// in a process of its own (envoyclient.StartChild), so that what this
// process spends is the gateway's and the sidecar's only. Every hop is
// real gRPC over loopback TCP. Each request has a body of about 1k or 16k
// tokens, for chat completions or completions, and runs through the
// response phase (headers, a one-chunk body), on each path:
//
//   - direct: the gateway to the EPP, no sidecar: what the gateway double
//     costs this process;
//   - null-relay: through a relay that pipes the stream to the EPP and
//     decides nothing: the floor of an extra ext_proc hop;
//   - relayed: through the sidecar, which routes the request (HealthBased,
//     the EPP probed as in production) and relays both phases to the EPP;
//   - skipped: the same with ResponsePhaseSkip: the sidecar answers the
//     response phase itself.
//
// ns/op, B/op and allocs/op are this process's, the gateway's share
// included; so is cpu-µs/op, the process's user and system CPU time per
// request (getrusage). The sidecar's own figures are a path's less
// direct's, run just before it: own-cpu-µs/op, own-B/op, own-allocs/op.
//
//	go test -run '^$' -bench SidecarRequest ./pkg/sidecar/ [-cpuprofile cpu.out -memprofile mem.out]
func BenchmarkSidecarRequest(b *testing.B) {
	paths := startRequestPaths(b)
	for _, rc := range requestCases() {
		costs := map[string]cost{}
		for _, p := range paths {
			b.Run(rc.name+"/"+p.name, func(b *testing.B) {
				b.ReportAllocs()
				before := readCost()
				for b.Loop() {
					if err := roundTrip(p.client, rc.req); err != nil {
						b.Fatal(err)
					}
				}
				c := readCost().since(before, b.N)
				b.ReportMetric(c.cpuPerOp(), "cpu-µs/op")
				if direct, ok := costs["direct"]; ok {
					own := c.less(direct)
					b.ReportMetric(own.cpuPerOp(), "own-cpu-µs/op")
					b.ReportMetric(own.bytesPerOp(), "own-B/op")
					b.ReportMetric(own.allocsPerOp(), "own-allocs/op")
				}
				costs[p.name] = c
			})
		}
	}
}

// requestCase is a kind of request of BenchmarkSidecarRequest.
type requestCase struct {
	name string
	req  envoyclient.Request
}

// requestCases are chat completions and completions with a prompt of
// about 1k and 16k tokens.
func requestCases() []requestCase {
	var cases []requestCase
	for _, tokens := range []int{1 << 10, 16 << 10} {
		size := fmt.Sprintf("%dk", tokens>>10)
		chat, err := json.Marshal(map[string]any{
			"model": "base",
			"messages": []map[string]string{
				{"role": "system", "content": promptText(tokens / 4)},
				{"role": "user", "content": promptText(tokens - tokens/4)},
			},
			"max_tokens": 64,
		})
		if err != nil {
			panic(err)
		}
		completion, err := json.Marshal(map[string]any{"model": "base", "prompt": promptText(tokens), "max_tokens": 64})
		if err != nil {
			panic(err)
		}
		usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":64,"total_tokens":%d}`, tokens, tokens+64)
		cases = append(cases,
			requestCase{name: "chat-" + size, req: envoyclient.Request{
				Path: "/v1/chat/completions", Body: chat,
				Response: &envoyclient.Response{
					Headers: http.Header{"Content-Type": {"application/json"}},
					Body:    []byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"base","choices":[{"index":0,"message":{"role":"assistant","content":"` + promptText(48) + `"},"finish_reason":"length"}],` + usage + `}`),
				},
			}},
			requestCase{name: "completions-" + size, req: envoyclient.Request{
				Path: "/v1/completions", Body: completion,
				Response: &envoyclient.Response{
					Headers: http.Header{"Content-Type": {"application/json"}},
					Body:    []byte(`{"id":"cmpl-1","object":"text_completion","model":"base","choices":[{"index":0,"text":"` + promptText(48) + `","finish_reason":"length"}],` + usage + `}`),
				},
			}},
		)
	}
	return cases
}

// promptText is about tokens tokens of text (a word and its space are a
// token, about five bytes), varied so that no two blocks of it are alike.
func promptText(tokens int) string {
	words := []string{"the", "model", "server", "cluster", "prompt", "cache", "token", "route", "gateway", "request", "answer", "pool"}
	var s strings.Builder
	for i := range tokens {
		if i%16 == 15 {
			fmt.Fprintf(&s, "%d. ", i)
			continue
		}
		s.WriteString(words[(i*7+i/12)%len(words)])
		s.WriteByte(' ')
	}
	return s.String()
}

// requestPath is a way from the gateway to the EPP.
type requestPath struct {
	name   string
	client *envoyclient.Client
}

// startRequestPaths starts mci-epp in a process of its own and, in this
// one, a null relay and the sidecar with the response phase relayed and
// skipped, all in front of it, and returns a gateway's client of each,
// warmed up: the EPP has scraped its model server and the sidecar has
// probed the EPP.
func startRequestPaths(tb testing.TB) []requestPath {
	eppProc := envoyclient.StartChild(tb, roleEPP, overheadModelEnv+"="+benchModelAddr())
	paths := []requestPath{{name: "direct", client: eppProc.Client}}
	for _, role := range []string{roleNullRelay, "relayed", "skipped"} {
		serverRole := map[string]string{"relayed": roleSidecar, "skipped": roleSidecarSkip}[role]
		addr := serveInProcess(tb, cmp.Or(serverRole, role), eppProc.Addr)
		client, err := envoyclient.Dial(addr, envoyclient.Options{})
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = client.Close() })
		paths = append(paths, requestPath{name: role, client: client})
	}
	warm := requestCases()[0].req
	for _, p := range paths {
		require.Eventually(tb, func() bool { return roundTrip(p.client, warm) == nil }, 30*time.Second, 10*time.Millisecond,
			"the %s path never answered: %v", p.name, roundTrip(p.client, warm))
		for range 50 {
			require.NoError(tb, roundTrip(p.client, warm))
		}
	}
	return paths
}

// roundTrip runs req through client's server, the response phase
// included, and checks that the EPP routed it and that the response came
// back whole.
func roundTrip(client *envoyclient.Client, req envoyclient.Request) error {
	res, err := client.Do(context.Background(), req)
	switch {
	case err != nil:
		return fmt.Errorf("round trip: %w", err)
	case res.Immediate != nil:
		return fmt.Errorf("immediate response %d: %s", res.Immediate.StatusCode, res.Immediate.Body)
	case res.Destination == "":
		return fmt.Errorf("no destination")
	case len(res.Body) != len(req.Body):
		return fmt.Errorf("the request body came back with %d bytes, sent %d", len(res.Body), len(req.Body))
	case res.Response == nil || len(res.Response.Body) != len(req.Response.Body):
		return fmt.Errorf("the response did not come back whole: %+v", res.Response)
	}
	return nil
}

// cost is what this process spent on n requests.
type cost struct {
	n             int
	cpu           time.Duration
	allocs, bytes int64
}

// readCost reads what this process has spent so far (n is 0).
func readCost() cost {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return cost{
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		allocs: int64(ms.Mallocs),
		bytes:  int64(ms.TotalAlloc),
	}
}

// since is what was spent from before to c, on n requests.
func (c cost) since(before cost, n int) cost {
	return cost{n: n, cpu: c.cpu - before.cpu, allocs: c.allocs - before.allocs, bytes: c.bytes - before.bytes}
}

// less is c's cost per request less base's, per c.n requests.
func (c cost) less(base cost) cost {
	f := float64(c.n) / float64(base.n)
	return cost{
		n:      c.n,
		cpu:    c.cpu - time.Duration(float64(base.cpu)*f),
		allocs: c.allocs - int64(float64(base.allocs)*f),
		bytes:  c.bytes - int64(float64(base.bytes)*f),
	}
}

func (c cost) cpuPerOp() float64    { return float64(c.cpu.Nanoseconds()) / 1e3 / float64(c.n) }
func (c cost) allocsPerOp() float64 { return float64(c.allocs) / float64(c.n) }
func (c cost) bytesPerOp() float64  { return float64(c.bytes) / float64(c.n) }

// Bounds of TestSidecarRequestCost: what the sidecar may cost per request
// against a null relay, the floor of an extra ext_proc hop, measured in the
// same run. Allocations are the sidecar's own (its path less direct's);
// CPU is the whole path's, gateway included, as the difference of two
// CPU figures taken on a shared machine is too noisy to bound. Set well
// above the figures measured when they were set (docs/performance.md), so
// that noise never fails them and a sidecar whose own cost triples always
// does.
const (
	// maxAllocsOverRelay and maxBytesOverRelay bound the sidecar's own
	// allocations and bytes allocated per request, over the null relay's
	// own (when set: 1.33x and 1.23x at 1k tokens, 1.31x and 1.47x at
	// 16k).
	maxAllocsOverRelay = 2.0
	// Bytes vary more than allocations, by what gRPC's buffer pools
	// happen to hold (1.35x to 1.7x at 16k tokens over a few runs).
	maxBytesOverRelay = 2.5
	// maxCPUOverRelay bounds the CPU of a request through the sidecar, over
	// one through the null relay, both with the gateway's share (1.0x to
	// 1.1x when set; a sidecar of three times its own CPU would be about
	// 2.9x).
	maxCPUOverRelay = 2.0
)

// TestSidecarRequestCost holds what one request costs the sidecar
// (BenchmarkSidecarRequest) to the bounds above, the response phase relayed,
// for a chat request of about 1k tokens and a completion of about 16k. The
// paths are measured in interleaved turns, so that a noisy neighbour weighs
// on all of them alike.
func TestSidecarRequestCost(t *testing.T) {
	paths := startRequestPaths(t)
	for _, tt := range []struct {
		name          string
		rounds, perOp int
		cpu           bool
	}{
		{name: "chat-1k", rounds: 8, perOp: 50, cpu: true},
		{name: "completions-16k", rounds: 4, perOp: 15},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var rc requestCase
			for _, c := range requestCases() {
				if c.name == tt.name {
					rc = c
				}
			}
			costs := measureInterleaved(t, paths, rc.req, tt.rounds, tt.perOp)
			direct, relay, side := costs["direct"], costs[roleNullRelay], costs["relayed"]
			relayOwn, sideOwn := relay.less(direct), side.less(direct)
			t.Logf("per request: sidecar's own %.0f allocs, %.0f B (null relay's own %.0f, %.0f); CPU through the sidecar %.0f µs, through the null relay %.0f µs, direct %.0f µs",
				sideOwn.allocsPerOp(), sideOwn.bytesPerOp(), relayOwn.allocsPerOp(), relayOwn.bytesPerOp(), side.cpuPerOp(), relay.cpuPerOp(), direct.cpuPerOp())
			assert.LessOrEqual(t, sideOwn.allocsPerOp(), maxAllocsOverRelay*relayOwn.allocsPerOp(), "the sidecar's own allocations per request, against %.1fx the null relay's", maxAllocsOverRelay)
			assert.LessOrEqual(t, sideOwn.bytesPerOp(), maxBytesOverRelay*relayOwn.bytesPerOp(), "the sidecar's own bytes allocated per request, against %.1fx the null relay's", maxBytesOverRelay)
			if tt.cpu {
				assert.LessOrEqual(t, side.cpuPerOp(), maxCPUOverRelay*relay.cpuPerOp(), "CPU per request through the sidecar, against %.1fx through the null relay", maxCPUOverRelay)
			}
		})
	}
}

// measureInterleaved sends req on every path, perOp requests at a time,
// the paths taking turns (their order rotating) for rounds rounds, and
// returns what each path's requests cost this process.
func measureInterleaved(t *testing.T, paths []requestPath, req envoyclient.Request, rounds, perOp int) map[string]cost {
	costs := map[string]cost{}
	for r := range rounds {
		for i := range paths {
			p := paths[(i+r)%len(paths)]
			before := readCost()
			for range perOp {
				require.NoError(t, roundTrip(p.client, req), p.name)
			}
			c, sum := readCost().since(before, perOp), costs[p.name]
			costs[p.name] = cost{n: sum.n + c.n, cpu: sum.cpu + c.cpu, allocs: sum.allocs + c.allocs, bytes: sum.bytes + c.bytes}
		}
	}
	return costs
}
