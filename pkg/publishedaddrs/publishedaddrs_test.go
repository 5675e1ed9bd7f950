package publishedaddrs

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func TestPublish(t *testing.T) {
	t.Run("a small pool is published address by address, sorted, without duplicates", func(t *testing.T) {
		assert.Equal(t, []string{"10.1.0.2", "10.1.0.10", "fd00::1"},
			Publish(addrs("fd00::1", "10.1.0.10", "10.1.0.2", "::ffff:10.1.0.2", "10.1.0.10")))
	})
	t.Run("nothing for no endpoints", func(t *testing.T) {
		assert.Empty(t, Publish(nil))
	})
	t.Run("zones and invalid addresses are dropped", func(t *testing.T) {
		assert.Equal(t, []string{"10.1.0.1"}, Publish([]netip.Addr{{}, netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("10.1.0.1")}))
	})
	t.Run("past Max addresses, the /24 and /64 prefixes that cover them", func(t *testing.T) {
		var many []netip.Addr
		for i := range Max + 1 {
			many = append(many, netip.AddrFrom4([4]byte{10, 2, byte(i / 200), byte(i % 200)}))
		}
		many = append(many, netip.MustParseAddr("fd00:1:2:3::9"))
		got := Publish(many)
		assert.Equal(t, []string{"10.2.0.0/24", "10.2.1.0/24", "10.2.2.0/24", "10.2.3.0/24", "10.2.4.0/24", "10.2.5.0/24", "fd00:1:2:3::/64"}, got)
		s, err := Parse(got)
		require.NoError(t, err)
		for _, a := range many {
			assert.True(t, s.Contains(a), "%s is covered", a)
		}
	})
	t.Run("past Max prefixes, the last ones are left out", func(t *testing.T) {
		var many []netip.Addr
		for i := range 2*Max + 2 {
			many = append(many, netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 1}), netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 2}))
		}
		got := Publish(many)
		assert.Len(t, got, Max)
		assert.Equal(t, "10.0.0.0/24", got[0])
		assert.Equal(t, "10.3.255.0/24", got[Max-1])
	})
}

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		name    string
		entries []string
		in, out []string
		err     string
	}{
		{name: "addresses", entries: []string{"10.1.0.1", "fd00::1"}, in: []string{"10.1.0.1", "fd00::1", "::ffff:10.1.0.1"}, out: []string{"10.1.0.2", "fd00::2", "fd00::1%eth0"}},
		{name: "prefixes", entries: []string{"10.1.0.0/24", "fd00:0:0:1::/64"}, in: []string{"10.1.0.200", "fd00:0:0:1::77"}, out: []string{"10.1.1.1", "fd00:0:0:2::1"}},
		{name: "nothing published: nothing passes", entries: nil, out: []string{"10.1.0.1"}},
		{name: "a wider prefix", entries: []string{"0.0.0.0/0"}, err: "/24"},
		{name: "a /16", entries: []string{"10.1.0.0/16"}, err: "/24"},
		{name: "a narrower prefix", entries: []string{"10.1.0.1/32"}, err: "/24"},
		{name: "a /48", entries: []string{"fd00::/48"}, err: "/64"},
		{name: "host bits", entries: []string{"10.1.0.1/24"}, err: "host bits"},
		{name: "an IPv4-mapped address", entries: []string{"::ffff:10.1.0.1"}, err: "IPv4-mapped"},
		{name: "an IPv4-mapped prefix", entries: []string{"::ffff:10.1.0.0/64"}, err: "IPv4-mapped"},
		{name: "a zone", entries: []string{"fe80::1%eth0"}, err: "zone"},
		{name: "a host name", entries: []string{"10.1.0.1", "kubernetes.default"}, err: "neither"},
		{name: "empty", entries: []string{""}, err: "neither"},
		{name: "too long", entries: []string{strings.Repeat("1", 100)}, err: "bytes long"},
		{name: "too many", entries: make([]string, Max+1), err: "at most"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.entries)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				assert.Zero(t, s.Len())
				return
			}
			require.NoError(t, err)
			for _, a := range tt.in {
				assert.True(t, s.Contains(netip.MustParseAddr(a)), a)
			}
			for _, a := range tt.out {
				assert.False(t, s.Contains(netip.MustParseAddr(a)), a)
			}
		})
	}
}

// FuzzParse feeds Parse arbitrary lists, as a member publishes them (one
// entry a line), and checks that what it accepts is bounded and means what
// Publish means: at most Max entries, every address it contains published
// as itself or within a /24 or /64, and Publish's answer for the accepted
// addresses parses again.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"10.1.0.1\nfd00::1", "10.1.0.0/24", "0.0.0.0/0", "::ffff:10.1.0.1", "fe80::1%eth0", "10.1.0.1/24", "", "fd00:0:0:1::/64\n10.0.0.0/8"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, list string) {
		entries := strings.Split(list, "\n")
		s, err := Parse(entries)
		if err != nil {
			return
		}
		if s.Len() > Max {
			t.Fatalf("%d entries accepted", s.Len())
		}
		var published []netip.Addr
		for a := range s.addrs {
			published = append(published, a)
		}
		for p := range s.prefixes {
			if p.Bits() != PrefixBits4 && p.Bits() != PrefixBits6 {
				t.Fatalf("prefix %s accepted", p)
			}
			published = append(published, p.Addr())
		}
		for _, a := range published {
			if !s.Contains(a) {
				t.Fatalf("%s accepted but not contained", a)
			}
		}
		if _, err := Parse(Publish(published)); err != nil {
			t.Fatalf("Publish(%v) does not parse: %v", published, err)
		}
	})
}
