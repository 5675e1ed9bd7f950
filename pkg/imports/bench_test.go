package imports

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// benchClusterSet is a ClusterSet of members clusters, each exporting the
// same pools pools (spread over 10 namespaces), each pool with its own EPP
// Service and a ready EndpointSlice, seen from the first member.
func benchClusterSet(b *testing.B, members, pools int) ClusterSet {
	b.Helper()
	const namespaces = 10
	var ms []Member
	for m := range members {
		var objs []runtime.Object
		for n := range namespaces {
			objs = append(objs, namespace(fmt.Sprintf("ns-%02d", n)))
		}
		for p := range pools {
			ns := fmt.Sprintf("ns-%02d", p%namespaces)
			epp := fmt.Sprintf("epp-%04d", p)
			objs = append(objs,
				pool(ns, fmt.Sprintf("pool-%04d", p), eppRef(poolv1.EndpointPickerRef{Name: epp, Port: &poolv1.Port{Number: 9002}})),
				service(ns, epp),
				slice(ns, epp, isNotReady, isReady),
			)
		}
		ms = append(ms, member(b, fmt.Sprintf("cluster-%02d", m), objs...))
	}
	return clusterSet("cluster-00", ms...)
}

func BenchmarkImportsAllNamespaces(b *testing.B) {
	cs := benchClusterSet(b, 10, 1000)
	imps := Imports(cs, "")
	require.Len(b, imps, 1000)
	require.Len(b, imps[0].Status.Clusters, 9)

	b.ReportAllocs()
	for b.Loop() {
		Imports(cs, "")
	}
}

func BenchmarkImportOne(b *testing.B) {
	cs := benchClusterSet(b, 10, 1000)
	b.ReportAllocs()
	for b.Loop() {
		Import(cs, "ns-05", "pool-0505")
	}
}

func BenchmarkExportsAllNamespaces(b *testing.B) {
	cs := benchClusterSet(b, 10, 1000)
	require.Len(b, Exports(cs, ""), 1000)
	b.ReportAllocs()
	for b.Loop() {
		Exports(cs, "")
	}
}
