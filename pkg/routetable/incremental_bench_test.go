package routetable

import (
	"fmt"
	"testing"

	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// benchInputs are sidecartest's Fleet.
func benchInputs() Inputs {
	f := sidecartest.NewFleet()
	return Inputs{Routes: f.Routes, Imports: f.Imports, Pools: f.Pools, Services: f.Services}
}

// BenchmarkIncremental is BenchmarkBuild's informer event (one import
// changes) for the Incremental builder: two routes are recompiled and one
// host group sorted again.
func BenchmarkIncremental(b *testing.B) {
	in := benchInputs()
	x := NewIncremental(in)
	x.Table()
	r := NewRouter()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		x.SetImport(importOf("pool-042", imported{name: "a", addr: fmt.Sprintf("127.0.2.%d", 1+i%2)}, imported{name: "c", addr: "127.0.3.1"}))
		t, changed := x.Table()
		if !changed || len(t.Errors) > 0 {
			b.Fatal(changed, t.Errors)
		}
		r.Publish(t)
	}
}
