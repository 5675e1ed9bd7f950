package bench

import (
	"fmt"
	"strings"
)

// Keys of the facts the scale model reads; each is recorded where it is
// measured.
const (
	factHeapIdle            = "heapIdleBytes"         // at factHeapIdleClusters
	factHeapIdleClusters    = "heapIdleClusters"      //
	factHeapPerMember       = "heapPerMemberBytes"    // slope between ClusterSet sizes
	factHeapPerPool         = "heapPerPoolBytes"      //
	factHeapPerUnrelated    = "heapPerUnrelatedBytes" // beside exported pools
	factHeapPerWatch        = "heapPerWatchBytes"     //
	factWatchesPerReplica   = "watchesPerReplicaPerMember"
	factWatchesPerPoolNS    = "watchesPerReplicaPerPoolNamespace"
	factConvP99             = "convergenceP99Ms" // at factConvClusters, the largest size
	factConvFloorP99        = "convergenceFloorP99Ms"
	factConvBaseP99         = "convergenceBaselineP99Ms"
	factConvClusters        = "convergenceClusters"
	factConvSlope           = "convergenceP50MsPerCluster" // slope of mci's p50
	factEtcdPerImport       = "baselineEtcdBytesPerImport"
	factListMsPer1k         = "listMsPer1000Imports"
	factListBaseMsPer1k     = "listBaselineMsPer1000"
	factBaseWritesPerChange = "baselineWritesPerExportChangePerMember"
	factBaseWritesPerFlap   = "baselineWritesPerFlapPerMember"
)

// scaleModel projects the measured per-unit costs to 100 clusters, for
// 10,000 exported pools in all (100 per cluster) and for 10,000 per cluster
// (1,000,000 in all). Every line says which measured fact it uses; a
// projection whose facts this run did not measure is left out.
func scaleModel(f map[string]float64) string {
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := f[k]; !ok {
				return false
			}
		}
		return true
	}
	var sb strings.Builder
	sb.WriteString("\n## Scale model: 100 clusters (projected from this run)\n\n")
	const clusters = 100.0
	cases := []struct {
		label string
		pools float64
	}{{"10,000 pools in all (100 per cluster)", 10000}, {"10,000 pools per cluster (1,000,000 in all)", 1e6}}
	if has(factHeapIdle, factHeapIdleClusters, factHeapPerMember, factHeapPerPool) {
		base := f[factHeapIdle] - f[factHeapIdleClusters]*f[factHeapPerMember]
		sb.WriteString("Memory of one mci-apiserver replica = idle base + members x heap per member + all exported pools x heap per pool")
		if has(factHeapPerUnrelated) {
			sb.WriteString(" + unrelated Services and EndpointSlices beside pools x heap per object")
		}
		fmt.Fprintf(&sb, " (base %.1f MiB, %.1f KiB per member, %.0f bytes per pool", base/mib, f[factHeapPerMember]/1024, f[factHeapPerPool])
		if has(factHeapPerUnrelated) {
			fmt.Fprintf(&sb, ", %.0f bytes per unrelated object", f[factHeapPerUnrelated])
		}
		sb.WriteString("). Every replica caches every member, so the ClusterSet holds this once per cluster.\n\n")
		sb.WriteString("| case | heap per replica | heap, all 100 replicas |")
		if has(factHeapPerUnrelated) {
			sb.WriteString(" + 10,000 unrelated objects beside pools per member |")
		}
		sb.WriteString("\n|---|---:|---:|")
		if has(factHeapPerUnrelated) {
			sb.WriteString("---:|")
		}
		sb.WriteString("\n")
		for _, c := range cases {
			h := base + clusters*f[factHeapPerMember] + c.pools*f[factHeapPerPool]
			fmt.Fprintf(&sb, "| %s | %.0f MiB | %.1f GiB |", c.label, h/mib, h*clusters/(1<<30))
			if has(factHeapPerUnrelated) {
				fmt.Fprintf(&sb, " +%.0f MiB per replica |", clusters*10000*f[factHeapPerUnrelated]/mib)
			}
			sb.WriteString("\n")
		}
		sb.WriteString("\n")
	}
	if has(factWatchesPerReplica) {
		fmt.Fprintf(&sb, "Watch connections per member kube-apiserver: 100 replicas x (%.1f", f[factWatchesPerReplica])
		if has(factWatchesPerPoolNS) {
			p := f[factWatchesPerPoolNS]
			fmt.Fprintf(&sb, " + %.1f per namespace holding pools) = **%.0f** with 10 such namespaces per member, **%.0f** with 100;",
				p, clusters*(f[factWatchesPerReplica]+10*p), clusters*(f[factWatchesPerReplica]+100*p))
		} else {
			fmt.Fprintf(&sb, ") = **%.0f**;", clusters*f[factWatchesPerReplica])
		}
		sb.WriteString(" each change of a watched object in a member is sent to every replica (event fan-out x100).\n\n")
	}
	if has(factHeapPerWatch) {
		fmt.Fprintf(&sb, "Clients: %.1f KiB of mci-apiserver heap per open watch of imports.\n\n", f[factHeapPerWatch]/1024)
	}
	if has(factConvP99, factConvClusters) {
		fmt.Fprintf(&sb, "Convergence: p99 %.1f ms at %.0f clusters (single-hop floor %.1f ms, CRD fan-out %.1f ms).", f[factConvP99], f[factConvClusters], f[factConvFloorP99], f[factConvBaseP99])
		if has(factConvSlope) {
			fmt.Fprintf(&sb, " mci's p50 moved %+.2f ms per added cluster between the measured sizes: %+.0f ms more at 100 clusters if linear. One change is one watch event to each replica and one computation of one key, so it should not grow with pools; it grows with the member's event fan-out (one event per replica).", f[factConvSlope], f[factConvSlope]*(clusters-f[factConvClusters]))
		}
		sb.WriteString("\n\n")
	}
	if has(factListMsPer1k) {
		fmt.Fprintf(&sb, "LIST: %.1f ms per 1,000 imports through the aggregator (%.1f ms per 1,000 custom resources): %.1f s for all imports of 10,000 pools, %.0f s for 1,000,000 unpaginated.\n\n",
			f[factListMsPer1k], f[factListBaseMsPer1k], f[factListMsPer1k]*10/1000, f[factListMsPer1k])
	}
	if has(factEtcdPerImport) {
		sb.WriteString("CRD fan-out at the same scale: every member stores the imports of all other members' pools.\n\n| case | etcd per member | etcd, all members |")
		if has(factBaseWritesPerChange, factBaseWritesPerFlap) {
			sb.WriteString(" writes per export change | writes per readiness flap |")
		}
		sb.WriteString("\n|---|---:|---:|")
		if has(factBaseWritesPerChange, factBaseWritesPerFlap) {
			sb.WriteString("---:|---:|")
		}
		sb.WriteString("\n")
		for _, c := range cases {
			per := c.pools * (clusters - 1) / clusters * f[factEtcdPerImport]
			fmt.Fprintf(&sb, "| %s | %.0f MiB | %.1f GiB |", c.label, per/mib, per*clusters/(1<<30))
			if has(factBaseWritesPerChange, factBaseWritesPerFlap) {
				fmt.Fprintf(&sb, " %.0f | %.0f |", f[factBaseWritesPerChange]*(clusters-1), f[factBaseWritesPerFlap]*(clusters-1))
			}
			sb.WriteString("\n")
		}
		sb.WriteString("\nmci writes nothing to importing clusters and nothing per readiness flap at any scale; in the exporting cluster it writes the pool's Exported status, one write per change of export state.\n")
	}
	return sb.String()
}
