package routetable

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzParseClusterRegions reads the cluster-regions annotation of tenants'
// HTTPRoutes: an error gives no regions (the route then allows no cluster);
// accepted regions are DNS labels, sorted, each once, and read back the
// same when joined.
func FuzzParseClusterRegions(f *testing.F) {
	for _, s := range []string{"", "eu", " eu-west-1 , us ,, ", "EU", "eu,eu", "-eu", "eu_1", ",", "é", "a.b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		regions, err := parseClusterRegions(s)
		if err != nil {
			require.Nil(t, regions, "refused regions %q gave regions", s)
			return
		}
		require.NotEmpty(t, regions)
		require.True(t, slices.IsSorted(regions))
		require.Equal(t, slices.Compact(slices.Clone(regions)), regions, "a region listed twice in %q", s)
		for _, r := range regions {
			require.Empty(t, validation.IsDNS1123Label(r), "region %q of %q", r, s)
		}
		again, err := parseClusterRegions(strings.Join(regions, ","))
		require.NoError(t, err)
		require.Equal(t, regions, again)
	})
}

// FuzzParseClusterTags reads the cluster-tags annotation of tenants'
// HTTPRoutes: an error gives no tags (the route then allows no cluster);
// accepted tags have label keys and label values, and read back the same
// when joined.
func FuzzParseClusterTags(f *testing.F) {
	for _, s := range []string{"", "slo=gold", " slo = gold , tier=premium ,, ", "slo", "=gold", "slo=gold,slo=silver",
		"slo=", "example.com/slo=gold", "slo=gold=1", "slo=gö", ",=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tags, err := parseClusterTags(s)
		if err != nil {
			require.Nil(t, tags, "refused tags %q gave tags", s)
			return
		}
		require.NotEmpty(t, tags)
		pairs := make([]string, 0, len(tags))
		for _, k := range slices.Sorted(maps.Keys(tags)) {
			require.Empty(t, validation.IsQualifiedName(k), "key %q of %q", k, s)
			require.Empty(t, validation.IsValidLabelValue(tags[k]), "value %q of %q", tags[k], s)
			pairs = append(pairs, k+"="+tags[k])
		}
		again, err := parseClusterTags(strings.Join(pairs, ","))
		require.NoError(t, err)
		require.Equal(t, tags, again)
	})
}
