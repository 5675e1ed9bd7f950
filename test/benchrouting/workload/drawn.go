package workload

import (
	"math"
	"math/rand/v2"
)

// The drawn workloads: Draw makes a workload of the routing benchmark's
// family from a seed alone, its parameters drawn wide, so that a rule is
// measured on shapes nobody picked. The routing benchmark plays them on
// its data path, pkg/clusterscore's simulation in pure logic. Their seeds
// are kept in two lists.
//
// TuningSeeds are the drawn workloads anyone changing a rule may look at
// and run as often as they like, beside the named workloads of the
// family, on which the rules were tuned.
//
// HeldOutSeeds are the held-out workloads: make bench-routing runs them
// and reports their worst against the hub configuration and the oracle,
// and nobody tunes on them. A rule tuned until these pass has been fitted
// to them and they stop telling how it does on a workload nobody saw, so a
// change to a rule needs a reason that holds for every workload
// (docs/design/cluster-scoring.md), and these seeds only check it. They
// were chosen before any of them had run; replacing one because it fails
// defeats them.
var (
	TuningSeeds  = []uint64{1, 2, 3, 4, 5}
	HeldOutSeeds = []uint64{9101, 9102, 9103, 9104, 9105, 9106, 9107, 9108, 9109, 9110}
)

// Drawn is a workload drawn from a seed: its requests (Profile, without
// a duration or rate), the load to calibrate its rate to (the share of the
// capacity without cache hits) and the batch places per server.
type Drawn struct {
	Profile Profile
	Load    float64
	Batch   int
}

// Draw draws the workload of seed: 4 to 64 groups, 1 to 6 open
// conversations per group, shared system prompts of 200 to 4,000 tokens,
// 1 to 16 turns, 20 to 160 tokens per user message, 16 to 64 tokens per
// answer, no one-shot requests to 60% of them, a load of 60 to 120% of
// the capacity without cache hits (up to and past the servers'
// saturation), 2 or 4 batch places per server. Groups, system prompts and
// user messages are drawn log-uniform, so that few and many, short and
// long, are as likely.
func Draw(seed uint64) Drawn {
	rng := rand.New(rand.NewPCG(seed, seed^0xda942042e4dd58b5))
	logUniform := func(lo, hi float64) int { return int(math.Round(lo * math.Pow(hi/lo, rng.Float64()))) }
	groups := logUniform(4, 64)
	perGroup := 1 + rng.IntN(6)
	system := 50 * (logUniform(200, 4000) / 50)
	turns := 1 + rng.IntN(16)
	user := logUniform(20, 160)
	output := []int{16, 32, 64}[rng.IntN(3)]
	hundredths := func(v float64) float64 { return math.Round(v*100) / 100 }
	oneShot := hundredths(0.6 * rng.Float64())
	load := hundredths(0.6 + 0.6*rng.Float64())
	batch := []int{2, 4}[rng.IntN(2)]
	return Drawn{
		Profile: Profile{Seed: seed, Groups: groups, SystemTokens: system, ActiveConversations: groups * perGroup, Turns: turns,
			UserTokens: user, OutputTokens: output, OneShotShare: oneShot, OneShotTokens: 300},
		Load: load, Batch: batch,
	}
}
