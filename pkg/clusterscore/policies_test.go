package clusterscore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/clusterscore/clusterscoretest"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// TestNamedPolicies holds the pipelines of the named configurations to
// clusterscoretest's cases, with the candidates the sidecar passes: the
// clusters in order, then a local pool outside the rotation (weight 0).
func TestNamedPolicies(t *testing.T) {
	for _, tc := range clusterscoretest.Cases() {
		t.Run(tc.Policy+"/"+tc.Name, func(t *testing.T) {
			cfg, err := routingpolicy.Parse(tc.Policy)
			require.NoError(t, err)
			p, err := clusterscore.New(cfg, scheduling.DefaultConfig(), clusterscore.NewMemory(clusterscore.DefaultMemoryOptions()))
			require.NoError(t, err)
			clusterscoretest.Check(t, tc, func() func() ([]string, error) {
				var cands []clusterscore.Candidate
				for i, n := range tc.Clusters {
					w := int64(1)
					if i < len(tc.Weights) {
						w = tc.Weights[i]
					}
					cands = append(cands, clusterscore.Candidate{Name: n, Weight: w, Health: tc.Health[n], Pool: tc.Metrics[n]})
				}
				if tc.Local {
					cands = append(cands, clusterscore.Candidate{Name: "local", Health: tc.Health["local"], Local: true})
				}
				rot := clusterscore.NewRotation(cands)
				return func() ([]string, error) {
					req := clusterscore.Request{Criticality: tc.Criticality, Now: clusterscoretest.Epoch}
					idx, err := p.Pick(&req, cands, rot, nil, nil)
					order := []string{}
					for _, i := range idx {
						order = append(order, cands[i].Name)
					}
					return order, err
				}
			})
		})
	}
}
