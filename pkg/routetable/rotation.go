package routetable

import "github.com/mci-dev/mci/pkg/clusterscore"

// rotation is the smooth weighted round-robin state (clusterscore.Rotation)
// of a rule's backendRefs or of a backend's clusters, with the key that
// identifies it across routing table rebuilds: its owner, then each
// candidate's name and weight. Router.Publish and Incremental carry a
// rotation whose key a new table still has over to it, so that frequent
// rebuilds do not skew the split.
type rotation struct {
	key string
	*clusterscore.Rotation
}

// newRotation returns the rotation of candidates of these names and
// weights, owned by owner.
func newRotation(owner string, names []string, weights []int64) *rotation {
	cands := make([]clusterscore.Candidate, len(names))
	for i, n := range names {
		cands[i] = clusterscore.Candidate{Name: n, Weight: weights[i]}
	}
	return rotationOf(owner, cands)
}

// rotationOf is the rotation of cands owned by owner; its key is the
// owner's, then the candidates' as the rotation has it (written once,
// for a backend of 1,000 clusters at every change of one).
func rotationOf(owner string, cands []clusterscore.Candidate) *rotation {
	r := clusterscore.NewRotation(cands)
	return &rotation{key: owner + "|" + r.Key(), Rotation: r}
}

// newClusterRotation returns the rotation of a backend's clusters. A local
// pool outside them (LocalFirst) is not part of it: the policies pass it
// after the clusters, with weight 0.
func newClusterRotation(owner string, clusters []*Cluster) *rotation {
	cands := make([]clusterscore.Candidate, len(clusters))
	for i, c := range clusters {
		cands[i] = clusterscore.Candidate{Name: c.Name, Weight: c.Weight}
	}
	return rotationOf(owner, cands)
}
