package bench

import (
	"fmt"
	"strings"
)

// Keys of the facts the scale model reads; each is recorded where it is
// measured. Those measured per mode are recorded as "<mode>.<key>"
// (summary.heapPerPoolBytes).
const (
	factHeapIdle                = "heapIdleBytes"         // at factHeapIdleClusters
	factHeapIdleClusters        = "heapIdleClusters"      //
	factHeapPerMember           = "heapPerMemberBytes"    // slope between ClusterSet sizes
	factHeapPerPool             = "heapPerPoolBytes"      //
	factHeapPerUnrelated        = "heapPerUnrelatedBytes" // beside exported pools
	factHeapPerWatch            = "heapPerWatchBytes"     //
	factWatchesStorage          = "storageWatchesPerReplicaPerMember"
	factWatchesProxied          = "proxiedWatchesPerReplicaPerMember"
	factWatchesPerPoolNS        = "watchesPerReplicaPerPoolNamespace"
	factPoolNamespacesAtOrigins = "poolNamespacesWhenWatchesAttributed"
	factConvP99                 = "convergenceP99Ms" // at factConvClusters, the largest size
	factFlapP99                 = "flapP99Ms"
	factConvFloorP99            = "convergenceFloorP99Ms"
	factConvBaseP99             = "convergenceBaselineP99Ms"
	factConvClusters            = "convergenceClusters"
	factConvSlope               = "convergenceP50MsPerCluster" // slope of mci's p50
	factEtcdPerImport           = "baselineEtcdBytesPerImport"
	factListMsPer1k             = "listMsPer1000Imports"
	factListBaseMsPer1k         = "listBaselineMsPer1000"
	factBaseWritesPerChange     = "baselineWritesPerExportChangePerMember"
	factBaseWritesPerFlap       = "baselineWritesPerFlapPerMember"
)

// modelCase is one fleet the model projects to.
type modelCase struct {
	label           string
	clusters, pools float64 // pools in all
}

var modelCases = []modelCase{
	{"100 clusters x 100 pools (10,000 in all)", 100, 1e4},
	{"1,000 clusters x 100 pools (100,000 in all)", 1000, 1e5},
}

// modelNamespaces is how many namespaces with pools each member has in the
// model (full mode watches Services and EndpointSlices per namespace).
const modelNamespaces = 10

// scaleModel projects the measured per-unit costs of both modes to 100
// and 1,000 clusters. Every figure says which measured fact it uses; a
// projection whose facts this run did not measure is left out.
func scaleModel(f map[string]float64) string {
	var sb strings.Builder
	sb.WriteString("\n## Scale model: 100 and 1,000 clusters (projected from this run)\n\n")
	for _, mode := range []string{modeSummary, modeFull} {
		heapModel(&sb, f, mode)
	}
	watchModel(&sb, f)
	otherModel(&sb, f)
	return sb.String()
}

func has(f map[string]float64, keys ...string) bool {
	for _, k := range keys {
		if _, ok := f[k]; !ok {
			return false
		}
	}
	return true
}

// heapModel: heap of one replica = base + C x per member + P x per pool
// (+ C x U x per unrelated object, U unrelated Services per member beside
// pools), P the exported pools of the whole fleet.
func heapModel(sb *strings.Builder, f map[string]float64, mode string) {
	k := func(key string) string { return mode + "." + key }
	if !has(f, k(factHeapIdle), k(factHeapIdleClusters), k(factHeapPerMember), k(factHeapPerPool)) {
		return
	}
	base := f[k(factHeapIdle)] - f[k(factHeapIdleClusters)]*f[k(factHeapPerMember)]
	unrelated := f[k(factHeapPerUnrelated)]
	fmt.Fprintf(sb, "**%s mode**: heap of one replica = base + C x per member + P x per pool + C x U x per unrelated object = %.1f MiB + C x %.1f KiB + P x %.0f B + C x U x %.0f B (C clusters, P exported pools in all, U unrelated Services+EndpointSlices beside pools per member).\n\n",
		mode, base/mib, f[k(factHeapPerMember)]/1024, f[k(factHeapPerPool)], unrelated)
	sb.WriteString("| fleet | heap per replica | all replicas (one per cluster) | + U = 1,000 per member |\n|---|---:|---:|---:|\n")
	for _, c := range modelCases {
		h := base + c.clusters*f[k(factHeapPerMember)] + c.pools*f[k(factHeapPerPool)]
		fmt.Fprintf(sb, "| %s | %.0f MiB | %.1f GiB | %+.0f MiB per replica |\n", c.label, h/mib, h*c.clusters/(1<<30), c.clusters*1000*unrelated/mib)
	}
	sb.WriteString("\n")
}

// watchModel: WATCH requests on one member kube-apiserver = (C-1) x
// (storage + proxied per remote replica) + its own server's.
func watchModel(sb *strings.Builder, f map[string]float64) {
	s, fl := modeSummary+".", modeFull+"."
	if !has(f, s+factWatchesStorage, s+factWatchesProxied, fl+factWatchesStorage) {
		return
	}
	perNS := f[fl+factWatchesPerPoolNS]
	fixed := f[fl+factWatchesStorage] - perNS*f[factPoolNamespacesAtOrigins]
	fmt.Fprintf(sb, "WATCH requests on one member kube-apiserver from the other clusters, with N = %d namespaces holding pools per member: full mode (C-1) x (%.1f + %.1f x N) on its storage; summary mode (C-1) x %.1f on its storage + (C-1) x %.1f proxied by its aggregator to its mci-apiserver (measured per remote replica by stopping one; the member's own mci-apiserver adds its own watches in both modes).\n\n",
		modelNamespaces, fixed, perNS, f[s+factWatchesStorage], f[s+factWatchesProxied])
	sb.WriteString("| fleet | full mode: storage watches | summary mode: storage watches | summary mode: proxied watches |\n|---|---:|---:|---:|\n")
	for _, c := range modelCases {
		fmt.Fprintf(sb, "| %s | %.0f | %.0f | %.0f |\n", c.label, (c.clusters-1)*(fixed+perNS*modelNamespaces),
			(c.clusters-1)*f[s+factWatchesStorage], (c.clusters-1)*f[s+factWatchesProxied])
	}
	sb.WriteString("\nIn full mode each change of a watched object in a member is sent to every replica of every cluster (event fan-out C-1); in summary mode a change reaches the member's own mci-apiserver, and one summary event goes to each remote replica only when the summary changes.\n\n")
}

func otherModel(sb *strings.Builder, f map[string]float64) {
	if has(f, factHeapPerWatch) {
		fmt.Fprintf(sb, "Clients: %.1f KiB of mci-apiserver heap per open watch of imports.\n\n", f[factHeapPerWatch]/1024)
	}
	for _, mode := range []string{modeSummary, modeFull} {
		if has(f, mode+"."+factConvP99, factConvClusters) {
			fmt.Fprintf(sb, "Convergence, %s mode: export change p99 %.1f ms at %.0f clusters (single-hop floor %.1f ms, CRD fan-out %.1f ms).", mode, f[mode+"."+factConvP99], f[factConvClusters], f[factConvFloorP99], f[factConvBaseP99])
			if has(f, mode+"."+factConvSlope) {
				fmt.Fprintf(sb, " p50 moved %+.2f ms per added cluster between the measured sizes: %+.0f ms at 1,000 clusters if linear.", f[mode+"."+factConvSlope], f[mode+"."+factConvSlope]*(1000-f[factConvClusters]))
			}
			sb.WriteString("\n\n")
		}
	}
	if has(f, factListMsPer1k) {
		fmt.Fprintf(sb, "LIST: %.1f ms per 1,000 imports through the aggregator (%.1f ms per 1,000 custom resources): %.1f s for all imports of 100,000 pools unpaginated.\n\n",
			f[factListMsPer1k], f[factListBaseMsPer1k], f[factListMsPer1k]*100/1000)
	}
	if !has(f, factEtcdPerImport) {
		return
	}
	sb.WriteString("CRD fan-out at the same scale: every member stores the imports of all other members' pools.\n\n| fleet | etcd per member | etcd, all members | writes per export change | writes per readiness flap |\n|---|---:|---:|---:|---:|\n")
	for _, c := range modelCases {
		per := c.pools * (c.clusters - 1) / c.clusters * f[factEtcdPerImport]
		fmt.Fprintf(sb, "| %s | %.0f MiB | %.1f GiB | %.0f | %.0f |\n", c.label, per/mib, per*c.clusters/(1<<30), f[factBaseWritesPerChange]*(c.clusters-1), f[factBaseWritesPerFlap]*(c.clusters-1))
	}
	sb.WriteString("\nmci writes nothing to importing clusters and nothing per readiness flap at any scale; in the exporting cluster it writes the pool's Exported status, one write per change of export state.\n")
}
