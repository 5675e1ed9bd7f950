package clusterscore

// Draining clusters (Candidate.Draining): an exporter drains a cluster
// ahead of maintenance while its export stays visible. New work goes
// elsewhere; what the cluster holds stays with it until it ends or its
// memory expires, so that conversations keep their cache and sessions
// their server, and the cluster empties as they end.

// holdsShare is how much of a request's prompt a draining cluster must be
// remembered to hold for the request to stay with it: more than half, so
// that a continued conversation (its earlier turns are its prompt's
// prefix) stays, and a new prompt that merely shares a system prompt with
// the cluster's conversations goes elsewhere.
const holdsShare = 0.5

// holds reports whether a draining candidate still takes req: the
// request's session is pinned to it, or it is remembered to hold more than
// holdsShare of the request's prompt blocks. Without the affinity memory
// (a policy that keeps none) a draining cluster holds nothing.
func (p *Pipeline) holds(req *Request, c *Candidate) bool {
	if p.mem == nil {
		return false
	}
	if req.Session != "" && p.mem.Sessions.Cluster(req.Scope, req.Session, req.Now) == c.Name {
		return true
	}
	if len(req.Blocks) == 0 {
		return false
	}
	ids, matched := [1]uint32{c.id()}, [1]int{}
	p.mem.Prefixes.Match(req.Blocks, ids[:], matched[:])
	return float64(matched[0]) > holdsShare*float64(len(req.Blocks))
}

// keepDraining keeps the draining candidates that the other filters kept,
// when they kept no other: a request goes to a draining cluster rather
// than to none (every cluster of the pool drained at once, or the others
// down). Draining is asked for, not a failure: the request is not a last
// resort.
func keepDraining(slots []slot, order []int) []int {
	for i := range slots {
		if slots[i].verdict == DroppedDraining {
			slots[i].verdict = Kept
			order = append(order, i)
		}
	}
	return order
}
