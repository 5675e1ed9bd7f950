package sidecar

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// TestManyClustersArePickedOverASample decides requests of one prompt over
// 1,000 clusters: a scoring policy orders a sample of them, led by the
// prompt's home once its key is established, the same home every time;
// when the filters keep none of the sample, or its best is saturated,
// every cluster is picked over (but where the sample drew the one that
// is not); a rotating policy orders them all.
func TestManyClustersArePickedOverASample(t *testing.T) {
	now := sidecartest.Epoch
	mem := clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
	tbl, st := scaleTable(t, routingpolicy.PrefixAffinity, 1000, now, mem)
	dc := decider{state: st}
	decide := func() decision {
		d := dc.decide(tbl, request("llm.model.com", "/v1/completions", groupPromptBody(3, 256)), routetable.Arrival{Main: true}, now, false)
		require.False(t, d.answers(), "%s %q", d.outcome, d.details)
		return d
	}
	first := decide()
	mem.Served(&first.req, first.order[0].Name)
	assert.True(t, first.req.Sampled)
	home := ""
	for range 50 {
		d := decide()
		mem.Served(&d.req, d.order[0].Name)
		assert.True(t, d.req.Sampled)
		assert.LessOrEqual(t, len(d.order), 32, "a sample's order")
		assert.Equal(t, clusterscore.HomeAtHome, d.req.Home.Outcome)
		if home == "" {
			home = d.order[0].Name
		}
		assert.Equal(t, home, d.order[0].Name, "the same home whatever was drawn")
	}

	// Every cluster out but one, which a sample seldom holds: the pick
	// goes over every cluster and finds it (or drew it).
	for i := range st.health {
		st.health[i] = HealthNotServing
	}
	st.health[777] = HealthServing
	for range 5 {
		d := decide()
		assert.Equal(t, []string{"cluster-0777"}, names(d.order))
	}

	// Every cluster ejected by outlier detection but one: the ejected
	// are a last resort of every cluster, not of a sample's.
	for i := range st.health {
		st.health[i] = clusterscore.HealthEjected
	}
	st.health[333] = HealthServing
	for range 5 {
		d := decide()
		assert.Equal(t, []string{"cluster-0333"}, names(d.order))
		assert.False(t, d.req.LastResort)
	}

	// Every cluster saturated but one: a sample's best is saturated,
	// so the pick goes over every cluster and leads with that one.
	for i := range st.health {
		st.health[i] = HealthServing
		m := *st.metrics[i]
		m.AverageQueue = 1000
		st.metrics[i] = &m
	}
	m := *st.metrics[555]
	m.AverageQueue = 0
	st.metrics[555] = &m
	for range 5 {
		d := decide()
		assert.Equal(t, "cluster-0555", d.order[0].Name)
		if !d.req.Sampled {
			assert.Len(t, d.order, 1000, "picked over every cluster: the saturated ones after it")
		}
	}

	rr, rst := scaleTable(t, routingpolicy.HealthBased, 1000, now, mem)
	d := decider{state: rst}.decide(rr, request("llm.model.com", "/v1/completions", groupPromptBody(3, 256)), routetable.Arrival{Main: true}, now, false)
	assert.Len(t, d.order, 1000, "a rotating policy orders every cluster")
}
