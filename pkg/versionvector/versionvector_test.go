package versionvector

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWithIsEncodeWithOneMoreComponent(t *testing.T) {
	tests := []struct {
		name       string
		components map[string]uint64
		add        string
	}{
		{name: "empty", components: map[string]uint64{}, add: "~pass"},
		{name: "first", components: map[string]uint64{"cluster-b": 7, "~view": 3}, add: "cluster-a"},
		{name: "between", components: map[string]uint64{"cluster-a": 7, "~epoch": 1, "~membership": 2, "~view": 3}, add: "~pass"},
		{name: "last", components: map[string]uint64{"cluster-a": 7, "~epoch": 1}, add: "~pass"},
		{name: "before the only one", components: map[string]uint64{"~view": 3}, add: "~pass"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := With(Encode(tc.components), tc.add, 42)
			require.NoError(t, err)
			want := map[string]uint64{tc.add: 42}
			for k, v := range tc.components {
				want[k] = v
			}
			assert.Equal(t, Encode(want), got)
		})
	}
	t.Run("an older format is encoded anew", func(t *testing.T) {
		got, err := With("djE7Y2x1c3Rlci1hPTc", "~pass", 1) // v1;cluster-a=7
		require.NoError(t, err)
		assert.Equal(t, Encode(map[string]uint64{"cluster-a": 7, "~pass": 1}), got)
	})
	t.Run("not a version", func(t *testing.T) {
		_, err := With("%%", "~pass", 1)
		assert.Error(t, err)
	})
}
