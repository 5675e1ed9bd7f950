package virtual

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The history keeps each change's version as a step from the one before;
// replaying the steps gives back every version.
func TestVersionStepsReplayTheVersions(t *testing.T) {
	versions := []Version{
		{epochComponent: 7},
		{epochComponent: 7, "cluster-a": 10},
		{epochComponent: 7, "cluster-a": 10}, // nothing moved: an empty step
		{epochComponent: 7, "cluster-a": 12, "cluster-b": 3},
		{epochComponent: 7, "cluster-a": 12, "cluster-b": 3, reachabilityComponent: 1700000000000},
		{epochComponent: 7, "cluster-a": 13, "cluster-b": 9, reachabilityComponent: 1700000000000},
	}
	end := Version{}
	var steps []versionStep
	for _, v := range versions {
		steps = append(steps, end.catchUp(v))
		assert.Equal(t, v, end, "catchUp raises the end to the new version")
	}
	assert.Empty(t, steps[2], "an unchanged version is an empty step")
	assert.Len(t, steps[3], 2)

	replayed := Version{}
	for i, step := range steps {
		replayed.apply(step)
		assert.Equal(t, versions[i], replayed, "version %d", i)
	}
}

// A version issued by an older replica (format v1) still resumes: the
// client of a rolling upgrade does not relist.
func TestVersionFormats(t *testing.T) {
	v := Version{"cluster-a": 123456, "cluster-b": 7, epochComponent: 1763790000000, reachabilityComponent: 1763790000123}
	v1 := "djE7Y2x1c3Rlci1hPTEyMzQ1NixjbHVzdGVyLWI9Nyx-ZXBvY2g9MTc2Mzc5MDAwMDAwMCx-bWVtYmVyc2hpcD0xNzYzNzkwMDAwMTIz" // base64url("v1;cluster-a=123456,cluster-b=7,~epoch=1763790000000,~membership=1763790000123")
	got, err := ParseVersion(v1)
	require.NoError(t, err)
	assert.Equal(t, v, got)

	v2 := v.String()
	assert.Equal(t, "v2;cluster-a=2n9c,cluster-b=7,~epoch=mi9v0y2o,~membership=mi9v0y63", v2)
	got, err = ParseVersion(v2)
	require.NoError(t, err)
	assert.Equal(t, v, got)
	assert.Less(t, len(v2), len(v1)*3/4)

	for _, bad := range []string{"v2;a", "v2;=1", "v2;a=1,", "v2;a=-1", "v3;a=1", "12345"} {
		_, err := ParseVersion(bad)
		assert.Error(t, err, bad)
	}
}
