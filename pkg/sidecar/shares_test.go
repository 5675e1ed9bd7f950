package sidecar

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// TestHomesLeaveAClusterBusyWithTrafficTheSidecarDoesNotPlace decides the
// requests of 9 groups of prompts over 3 clusters for a minute while the
// EPPs count the requests they route: this cluster's 3 a second at each,
// and at cluster-0000 6 a second more from its own users. The decision
// names this sidecar's cluster to the shares (clusterscore.Shares), which
// then deal cluster-0000 fewer of the groups than its capacity's third;
// with EPPs that count nothing (upstream EPPs) it keeps its third.
func TestHomesLeaveAClusterBusyWithTrafficTheSidecarDoesNotPlace(t *testing.T) {
	const groups = 9
	homesAt := func(counted bool) map[string]int {
		now := sidecartest.Epoch
		mem := clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
		tbl, st := scaleTable(t, routingpolicy.PrefixAffinity, 3, now, mem)
		dc := decider{state: st}
		decideGroup := func(g int, at time.Time) decision {
			d := dc.decide(tbl, request("llm.model.com", "/v1/completions", groupPromptBody(g, 256)), routetable.Arrival{Main: true}, at, false)
			require.False(t, d.answers(), "%s %q", d.outcome, d.details)
			require.Equal(t, tbl.LocalCluster(), d.req.Cluster, "the decision names the sidecar's cluster as it relays under it")
			return d
		}
		for sec := range 61 {
			at := now.Add(time.Duration(sec) * time.Second)
			for i := range st.metrics {
				m := *st.metrics[i]
				m.UpdatedAt, m.AverageQueue = at, 0
				if counted {
					m.RelayedRequests = map[string]float64{tbl.LocalCluster(): 3 * float64(sec), "": 0}
					if i == 0 {
						m.RelayedRequests[""] = 6 * float64(sec)
					}
				}
				st.metrics[i] = &m
			}
			for g := range groups {
				d := decideGroup(g, at)
				mem.Served(&d.req, d.order[0].Name)
			}
		}
		homes := map[string]int{}
		for g := range groups {
			homes[decideGroup(g, now.Add(61*time.Second)).order[0].Name]++
		}
		return homes
	}
	without, with := homesAt(false), homesAt(true)
	t.Logf("homes of %d groups: %v counted, %v not", groups, with, without)
	assert.Equal(t, groups/3, without["cluster-0000"], "not counted: its capacity's third")
	assert.Less(t, with["cluster-0000"], groups/3, "counted: fewer than its third, the others more")
	assert.Equal(t, groups, with["cluster-0000"]+with["cluster-0001"]+with["cluster-0002"], fmt.Sprint(with))
}
