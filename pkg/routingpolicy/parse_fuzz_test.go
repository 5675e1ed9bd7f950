package routingpolicy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzParse reads the policy annotation of tenants' HTTPRoutes, pools and
// imports: no input panics; every error wraps ErrSyntax; what parses is
// valid and named by its text trimmed, which reads back as itself; and its
// canonical form reads back to the same configuration, so that what
// mci-apiserver serves on an import is what the exporter asked for and
// nothing else.
func FuzzParse(f *testing.F) {
	seeds := []string{"", "queue=1", "prefix-cache=3,session=2,pick=two-choices,filters=health+ready", "a=b=c", ",,,",
		"queue=1e309", "queue=NaN", "filters=+", "queue=0x1p-2,affinity-margin=off", "in-flight=1,home-bound=100,queue-margin=0",
		"pick=chain,filters=local-first", strings.Repeat("queue=1,", 100), "queue=1,\x00", "queue=1,pick=round-robin,home-bound=2",
		" ", " PrefixAffinity\t", "queue=1,queue=2", "=", "prefix-cache=-1", strings.Repeat("queue=1,", 1000)}
	for _, s := range append(seeds, Names...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			require.ErrorIs(t, err, ErrSyntax)
			return
		}
		require.NoError(t, c.Validate())
		require.Equal(t, strings.TrimSpace(c.Name), c.Name)
		again, err := Parse(c.Name)
		require.NoError(t, err, "accepted policy %q does not read back", c.Name)
		require.Equal(t, c, again)
		canonical := c.Canonical()
		back, err := Parse(canonical)
		require.NoError(t, err, "the canonical form %q of %q parses", canonical, s)
		assert.Equal(t, canonical, back.Canonical())
		c.Name = back.Name
		assert.Equal(t, c, back, "the canonical form %q of %q reads back to the same configuration", canonical, s)
	})
}
