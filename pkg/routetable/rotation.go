package routetable

import (
	"strconv"
	"strings"

	"github.com/mci-dev/mci/pkg/clusterscore"
)

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
	var b strings.Builder
	b.WriteString(owner)
	for i, n := range names {
		cands[i] = clusterscore.Candidate{Name: n, Weight: weights[i]}
		b.WriteByte('|')
		b.WriteString(n)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(weights[i], 10))
	}
	return &rotation{key: b.String(), Rotation: clusterscore.NewRotation(cands)}
}

// newClusterRotation returns the rotation of a backend's clusters. A local
// pool outside them (LocalFirst) is not part of it: the policies pass it
// after the clusters, with weight 0.
func newClusterRotation(owner string, clusters []*Cluster) *rotation {
	names := make([]string, len(clusters))
	weights := make([]int64, len(clusters))
	for i, c := range clusters {
		names[i], weights[i] = c.Name, c.Weight
	}
	return newRotation(owner, names, weights)
}
