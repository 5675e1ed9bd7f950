package clusterscore_test

import (
	"fmt"
	"time"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// A request's life in the sidecar: the pipeline comes from the backend's
// annotation, the memory is the sidecar's, the rotation the backend's.
func Example() {
	cfg, err := routingpolicy.Parse("PrefixAffinity")
	if err != nil {
		panic(err)
	}
	mem := clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
	p, err := clusterscore.New(cfg, scheduling.DefaultConfig(), mem)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cands := []clusterscore.Candidate{
		{Name: "east", Weight: 1, Health: clusterscore.HealthServing},
		{Name: "west", Weight: 1, Health: clusterscore.HealthServing},
	}
	rot := clusterscore.NewRotation(cands) // kept across rebuilds while rot.Fits(cands)

	body := []byte(`{"model":"llm","messages":[{"role":"system","content":"You are a terse assistant who answers in one line, citing the manual's section numbers."},{"role":"user","content":"How do I rotate the token?"}]}`)
	blocks, _ := promptprefix.Blocks(nil, "ns/llm", body)
	session := clusterscore.SessionSpec{Header: "x-session-id"}.Key(func(string) string { return "alice" })
	req := &clusterscore.Request{Criticality: scheduling.Standard, Now: now, Scope: "ns/llm", Blocks: blocks, Session: session}

	// The first turn goes to the home of its prompt, hashed from its
	// leading blocks: the same on every sidecar replica.
	order, err := p.Pick(req, cands, rot, nil, nil)
	first := cands[order[0]].Name
	mem.Observed.Started("ns/llm", first, now)
	mem.Observed.FirstByte("ns/llm", first, 80*time.Millisecond)
	mem.Observed.Finished("ns/llm", first, false)
	mem.Served(req, first)

	// The next request of the conversation goes there again.
	var ex clusterscore.Explanation
	order, err = p.Pick(req, cands, rot, order[:0], &ex)
	fmt.Println(first, cands[order[0]].Name, cands[order[1]].Name, err)
	fmt.Println(ex.String())
	// Output:
	// east east west <nil>
	// PrefixAffinity home-outcome=home,home=east,home-load=0,home-bound=1,capacities-unknown east:kept,tier=0,load=0,prefix-cache=1,session=1,in-flight=1,latency=1,errors=1,queue=0.5,kv-cache=0.5,total=9 west:kept,tier=0,load=0,prefix-cache=0,session=0,in-flight=1,latency=1,errors=1,queue=0.5,kv-cache=0.5,total=4
}
