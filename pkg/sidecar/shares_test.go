package sidecar

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	homesAt := func(counted bool) (map[string]int, map[string]float64) {
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
		return homes, sharesMetric(t, mem)
	}
	without, sharesWithout := homesAt(false)
	with, sharesWith := homesAt(true)
	t.Logf("homes of %d groups: %v counted, %v not; shares %v counted, %v not", groups, with, without, sharesWith, sharesWithout)
	assert.Equal(t, groups/3, without["cluster-0000"], "not counted: its capacity's third")
	assert.Less(t, with["cluster-0000"], groups/3, "counted: fewer than its third, the others more")
	assert.Equal(t, groups, with["cluster-0000"]+with["cluster-0001"]+with["cluster-0002"], fmt.Sprint(with))
	// mci_sidecar_prefix_home_shares says so.
	for _, c := range []string{"cluster-0000", "cluster-0001", "cluster-0002"} {
		assert.InDelta(t, 1.0/3, sharesWithout[c], 1e-9, "not counted: %s's capacity's third", c)
	}
	assert.Less(t, sharesWith["cluster-0000"], 1.0/3-0.1, "counted")
	assert.InDelta(t, 1, sharesWith["cluster-0000"]+sharesWith["cluster-0001"]+sharesWith["cluster-0002"], 2.0/64, "counted, rounded to 1/64 each")
}

// sharesMetric is mci_sidecar_prefix_home_shares of mem, by cluster.
func sharesMetric(t *testing.T, mem *clusterscore.Memory) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	registerScoringMetrics(reg, mem)
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "mci_sidecar_prefix_home_shares" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["cluster"]] = m.GetGauge().GetValue()
		}
	}
	return out
}

// chatTurn is the chat body of turn (from 1) of conversation c of group
// g: the group's system prompt, then each turn's user message and, before
// the last, the answers the client resends.
func chatTurn(g, c, turn int) []byte {
	msgs := []map[string]string{{"role": "system", "content": string(groupSystemPrompt(g))}}
	for k := 1; k <= turn; k++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d asks question %d of many words to fill a block or two of text", c, k)})
		if k < turn {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d of conversation %d", k, c)})
		}
	}
	body, _ := json.Marshal(map[string]any{"model": "llm", "messages": msgs, "max_tokens": 16})
	return body
}

func groupSystemPrompt(g int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "You are assistant %d of a fleet. ", g)
	for i := 0; b.Len() < 1024; i++ {
		fmt.Fprintf(&b, "rule%d ", i)
	}
	return []byte(b.String())
}

// TestConversationsSplitOffAHomeOverItsShareStayWhereTheyWent decides chat
// conversations of one group through the sidecar while the EPPs count
// their cluster's home serving 6 requests a second of all 9: a
// conversation the group opens goes elsewhere (split), and its next turns
// follow it there, where its history is; a conversation that went home
// stays home.
func TestConversationsSplitOffAHomeOverItsShareStayWhereTheyWent(t *testing.T) {
	now := sidecartest.Epoch
	mem := clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
	tbl, st := scaleTable(t, routingpolicy.PrefixAffinity, 3, now, mem)
	dc := decider{state: st}
	decide := func(body []byte, at time.Time) (string, clusterscore.HomeOutcome) {
		d := dc.decide(tbl, request("llm.model.com", "/v1/chat/completions", body), routetable.Arrival{Main: true}, at, false)
		require.False(t, d.answers(), "%s %q", d.outcome, d.details)
		require.NoError(t, d.promptErr)
		mem.Served(&d.req, d.order[0].Name)
		return d.order[0].Name, d.req.Home.Outcome
	}
	// The EPPs' counts at second sec of this sidecar's requests (a
	// few groups' traffic, which the shares deal by count): 1 a second
	// at each cluster, and 6 more at busy; and of another importing
	// cluster's, 1 a second at each (a third of all the requests when
	// none is busy: traffic this sidecar does not place, without which
	// nothing is split).
	count := func(sec int, busy string) time.Time {
		at := now.Add(time.Duration(sec) * time.Second)
		for i, c := range tbl.Rules()[0].Backends[0].Clusters {
			m := *st.metrics[i]
			m.UpdatedAt, m.AverageQueue = at, 0
			mine := tbl.LocalCluster()
			if c.Local {
				mine = ""
			}
			m.RelayedRequests = map[string]float64{mine: float64(sec), "cluster-x": float64(sec)}
			if c.Name == busy {
				m.RelayedRequests[mine] = 7 * float64(sec)
			}
			st.metrics[i] = &m
		}
		return at
	}
	_, outcome := decide(chatTurn(0, 0, 1), count(0, ""))
	require.Equal(t, clusterscore.HomeDealt, outcome, "a key new to the sidecar")
	home, outcome := decide(chatTurn(0, 0, 2), now)
	require.Equal(t, clusterscore.HomeAtHome, outcome, "established")
	for sec := range 31 {
		_, outcome := decide(chatTurn(0, 0, 3+sec), count(sec, home))
		require.Equal(t, clusterscore.HomeAtHome, outcome, "a conversation at home stays home")
	}
	at := now.Add(30 * time.Second)
	to, outcome := decide(chatTurn(0, 1, 1), at)
	assert.Equal(t, clusterscore.HomeSplit, outcome, "a conversation opens")
	assert.NotEqual(t, home, to)
	for turn := 2; turn <= 4; turn++ {
		next, outcome := decide(chatTurn(0, 1, turn), at)
		assert.Equal(t, clusterscore.HomeFollowed, outcome, "turn %d", turn)
		assert.Equal(t, to, next, "turn %d", turn)
	}
}
