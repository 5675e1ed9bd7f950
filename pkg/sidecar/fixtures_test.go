package sidecar

import (
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// ns is the namespace of sidecartest's objects.
const ns = sidecartest.Namespace

// buildTable is the routing table of in's objects and settings, built as
// the sidecar builds it (routetable.Incremental), with its problems. It is
// not published: its policies are compiled by the router that publishes
// it (h.router.Publish), which must have its server's scoring already.
func buildTable(in routetable.Inputs) (*routetable.Table, []error) {
	t, _ := routetable.NewIncremental(in).Table()
	return t, t.Errors
}

// publishTable is buildTable published by r, which compiles its policies.
func publishTable(r *routetable.Router, in routetable.Inputs) (*routetable.Table, []error) {
	t, _ := routetable.NewIncremental(in).Table()
	r.Publish(t)
	return t, t.Errors
}
