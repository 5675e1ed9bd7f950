package workload

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Population is one population of users of a workload: the users that
// send their requests in one place (Entry), with Share of the arrivals.
// A workload of several populations is the traffic a router only partly
// sees: the users of the importing cluster's gateway beside the
// exporting clusters' own users, who send to their cluster's gateway, or
// the users of two importing gateways.
type Population struct {
	// Entry names where the population's requests enter, for whoever
	// sends them; "" is the first population's, and at most one
	// population has it.
	Entry string
	Share float64
}

func validateUsers(users []Population) []error {
	if len(users) == 0 {
		return nil
	}
	var errs []error
	sum := 0.0
	seen := map[string]bool{}
	for _, u := range users {
		if !(u.Share > 0 && u.Share <= 1) {
			errs = append(errs, fmt.Errorf("population %q: share %v is not in (0, 1]", u.Entry, u.Share))
		}
		if seen[u.Entry] {
			errs = append(errs, fmt.Errorf("population %q: two populations enter there", u.Entry))
		}
		seen[u.Entry] = true
		sum += u.Share
	}
	if math.Abs(sum-1) > 1e-9 {
		errs = append(errs, fmt.Errorf("the populations' shares sum to %v, want 1", sum))
	}
	return errs
}

// generateUsers is the workload of p as its populations: each is a
// workload of its own, generated as one population is, from p with the
// population's share of the rate, of the groups and of the open
// conversations (at least one each: the same density of conversations
// per request as p), its own seed and its own text; its requests carry
// its entry. Their requests merge in the order they are sent. So the
// whole has p's arrival rate, turns and lengths, and no population
// shares a prefix with another, but for the system prompts when
// p.SharedSystemPrompts: then each population draws from all of p's
// groups, whose prompts are the same text for all.
func generateUsers(p Profile) []Request {
	var out []Request
	for i, u := range p.Users {
		q := p
		q.Users = nil
		q.Rate = p.Rate * u.Share
		q.Groups = max(1, int(math.Round(float64(p.Groups)*u.Share)))
		q.ActiveConversations = max(1, int(math.Round(float64(p.ActiveConversations)*u.Share)))
		// The first population keeps p's seed; the others draw from
		// seeds of their own, derived from p's.
		q.Seed = p.Seed + uint64(i)*0x9e3779b97f4a7c15
		if u.Entry != "" {
			q.TextPrefix = p.TextPrefix + u.Entry + "-"
		}
		systemPrefix := q.TextPrefix
		if p.SharedSystemPrompts {
			q.Groups, systemPrefix = p.Groups, p.TextPrefix
		}
		reqs := generate(q, systemPrefix)
		for j := range reqs {
			reqs[j].Entry = u.Entry
		}
		out = append(out, reqs...)
	}
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	for i := range out {
		out[i].Index = i
	}
	return out
}
