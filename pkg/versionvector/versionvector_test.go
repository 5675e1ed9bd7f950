package versionvector

import (
	"maps"
	"strings"
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

// FuzzWith checks With against Encode: whatever rv is, With does not
// panic, and for an rv that decodes and lacks the component, it gives a
// version of rv's components and that one; Encode's own encoding of them
// when rv is Encode's.
//
// Trusted input: a Store's own versions (a client's resourceVersion is
// decoded by Decode, fuzzed through the Store's version parsing).
func FuzzWith(f *testing.F) {
	for _, s := range []string{"v2;", "v2;cluster-a=7,~epoch=1,~view=3", "v2;~view=1", "djE7Y2x1c3Rlci1hPTc", "v2;a=1,,b=2", "v2;=", "%%"} {
		f.Add(s, "~pass")
	}
	f.Fuzz(func(t *testing.T, rv, name string) {
		got, err := With(rv, name, 5)
		components, decodeErr := Decode(rv)
		if decodeErr != nil || err != nil {
			return
		}
		if _, has := components[name]; has || name == "" || strings.ContainsAny(name, ",=") {
			return
		}
		canonical := Encode(components) == rv
		components[name] = 5
		if canonical && got != Encode(components) {
			t.Fatalf("With(%q, %q) = %q, want %q", rv, name, got, Encode(components))
		}
		if read, err := Decode(got); err != nil || !maps.Equal(read, components) {
			t.Fatalf("With(%q, %q) = %q, which decodes to %v (%v), want %v", rv, name, got, read, err, components)
		}
	})
}
