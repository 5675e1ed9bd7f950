package routetable

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzParseClusterWeights reads the cluster-weights annotation of tenants'
// HTTPRoutes and pools: an error gives no weights (the caller then weighs
// clusters 1 each); accepted weights are in range, name each cluster once
// with a name that holds neither separator, and format back to the same
// map.
func FuzzParseClusterWeights(f *testing.F) {
	for _, s := range []string{"", "a=1", " a=1 ,b = 20,, ", "a", "=1", "a=-1", "a=x", "a=2000000", "a=1000000",
		"a=1,a=2", "a=0", "a==1", "a=1=2", "a=+1", "a=0x10", "a=9223372036854775808", "é=1,\x00=2", ",=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := parseClusterWeights(s)
		if err != nil {
			require.Nil(t, w, "refused weights %q gave weights", s)
			return
		}
		require.NotNil(t, w)
		items := 0
		for item := range strings.SplitSeq(s, ",") {
			if strings.TrimSpace(item) != "" {
				items++
			}
		}
		require.Len(t, w, items, "a cluster named twice in %q was accepted", s)
		formatted := make([]string, 0, len(w))
		for _, name := range slices.Sorted(maps.Keys(w)) {
			n := w[name]
			require.NotEmpty(t, name)
			require.Equal(t, strings.TrimSpace(name), name)
			require.NotContains(t, name, ",")
			require.NotContains(t, name, "=")
			require.True(t, n >= 0 && n <= 1000000, "weight %d of %q", n, name)
			formatted = append(formatted, fmt.Sprintf("%s=%d", name, n))
		}
		again, err := parseClusterWeights(strings.Join(formatted, ","))
		require.NoError(t, err)
		require.Equal(t, w, again)
	})
}

// FuzzParseEndpointPicker reads the local-endpoint-picker annotation of
// tenants' pools: an accepted value names a Service of the pool's
// namespace (a DNS-1035 label, so never another namespace's) and a port
// from 1 to 65535 when it has one, and formats back to the same reference.
func FuzzParseEndpointPicker(f *testing.F) {
	for _, s := range []string{"epp", " epp:9002 ", "epp:0", "epp:65536", "epp:-1", "epp:+80", "epp:080", ":9002", "ns/epp",
		"epp:", "epp:1:2", "EPP", "epp.other", "épp", "a b:1", strings.Repeat("a", 64), "epp:9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := parseEndpointPicker(s)
		if err != nil {
			return
		}
		require.Empty(t, validation.IsDNS1035Label(ref.Name), "accepted %q names Service %q", s, ref.Name)
		formatted := ref.Name
		if ref.Port != nil {
			require.True(t, ref.Port.Number >= 1 && ref.Port.Number <= 65535, "port %d of %q", ref.Port.Number, s)
			formatted += ":" + strconv.Itoa(int(ref.Port.Number))
		}
		again, err := parseEndpointPicker(formatted)
		require.NoError(t, err)
		require.Equal(t, ref, again)
	})
}
