package sidecar

import (
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// ns is the namespace of sidecartest's objects.
const ns = sidecartest.Namespace

// buildTable is the routing table of in's objects and settings, built as
// the sidecar builds it (routetable.Incremental), with its problems.
func buildTable(in routetable.Inputs) (*routetable.Table, []error) {
	t, _ := routetable.NewIncremental(in).Table()
	return t, t.Errors
}
