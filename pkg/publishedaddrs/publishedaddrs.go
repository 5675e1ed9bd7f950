// Package publishedaddrs is the one rule for the addresses an exporting
// cluster publishes of an exported pool's endpoints (the IPs of the
// model-server pods its selector picks), which an importing sidecar holds
// a remote Endpoint Picker's destination to: the exporter writes them with
// Publish, and every reader (the importing mci-apiserver, which passes
// them on in the import, and the sidecar) reads them with Parse.
//
// The list is bounded: at most Max entries. A pool of at most Max pods is
// published address by address; past Max, as the /24 (IPv4) or /64 (IPv6)
// prefixes that cover its addresses, the ranges a node's pod CIDR is cut
// into, so a pool of thousands of pods on a few hundred nodes still fits.
// Past Max prefixes (more than 262,144 IPv4 pods) the prefixes that sort
// last are left out, and their pods' addresses are refused as destinations.
// A prefix is never wider than /24 or /64: a member that publishes
// 0.0.0.0/0 would otherwise let its EPP name any address.
package publishedaddrs

import (
	"fmt"
	"net/netip"
	"slices"
)

// Max bounds the entries of one pool's published list.
const Max = 1024

// PrefixBits4 and PrefixBits6 are the only prefix lengths a list may carry.
const (
	PrefixBits4 = 24
	PrefixBits6 = 64
)

// maxEntryLen bounds an entry read: every valid entry is shorter (an IPv6
// address in text is at most 45 bytes).
const maxEntryLen = 64

// Publish returns the list published for a pool whose endpoints have the
// addresses addrs (duplicates, zones and invalid addresses dropped;
// IPv4-mapped IPv6 addresses as IPv4): the sorted addresses when there are
// at most Max, else the sorted covering prefixes, at most Max; nil for
// none.
func Publish(addrs []netip.Addr) []string {
	set := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() && a.Zone() == "" {
			set = append(set, a.Unmap())
		}
	}
	slices.SortFunc(set, netip.Addr.Compare)
	set = slices.Compact(set)
	if len(set) == 0 {
		return nil
	}
	if len(set) <= Max {
		out := make([]string, len(set))
		for i, a := range set {
			out[i] = a.String()
		}
		return out
	}
	out := make([]string, 0, Max)
	var last netip.Prefix
	for _, a := range set {
		p := cover(a)
		if p == last {
			continue
		}
		if len(out) == Max {
			break
		}
		out = append(out, p.String())
		last = p
	}
	return out
}

// cover is the prefix of a published list that holds a.
func cover(a netip.Addr) netip.Prefix {
	bits := PrefixBits6
	if a.Is4() {
		bits = PrefixBits4
	}
	p, _ := a.Prefix(bits)
	return p
}

// Set is a parsed list: membership is a map lookup or two, whatever the
// list's length.
type Set struct {
	addrs    map[netip.Addr]struct{}
	prefixes map[netip.Prefix]struct{}
}

// Parse reads a published list, an exporting member's untrusted input: at
// most Max entries, each an IP address or a /24 IPv4 or /64 IPv6 prefix in
// canonical form (the address masked), without a zone, IPv4 never written
// as IPv4-mapped IPv6. Any malformed entry makes the whole list an error:
// a member that publishes one wrong entry may have published others.
func Parse(entries []string) (Set, error) {
	if len(entries) > Max {
		return Set{}, fmt.Errorf("%d endpoint addresses, at most %d", len(entries), Max)
	}
	s := Set{addrs: make(map[netip.Addr]struct{}, len(entries))}
	for i, e := range entries {
		if len(e) > maxEntryLen {
			return Set{}, fmt.Errorf("endpoint address %d is %d bytes long", i, len(e))
		}
		if a, err := netip.ParseAddr(e); err == nil {
			if a.Zone() != "" || a.Is4In6() {
				return Set{}, fmt.Errorf("endpoint address %q has a zone or is an IPv4-mapped IPv6 address", e)
			}
			s.addrs[a] = struct{}{}
			continue
		}
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return Set{}, fmt.Errorf("endpoint address %q is neither an IP address nor a prefix", e)
		}
		if err := checkPrefix(p); err != nil {
			return Set{}, fmt.Errorf("endpoint address %q: %w", e, err)
		}
		if s.prefixes == nil {
			s.prefixes = map[netip.Prefix]struct{}{}
		}
		s.prefixes[p] = struct{}{}
	}
	return s, nil
}

func checkPrefix(p netip.Prefix) error {
	a := p.Addr()
	switch {
	case a.Is4In6():
		return fmt.Errorf("an IPv4-mapped IPv6 prefix")
	case a.Is4() && p.Bits() != PrefixBits4, a.Is6() && p.Bits() != PrefixBits6:
		return fmt.Errorf("a prefix is /%d for IPv4 or /%d for IPv6", PrefixBits4, PrefixBits6)
	case p.Masked() != p:
		return fmt.Errorf("the prefix has host bits set (%s)", p.Masked())
	}
	return nil
}

// Contains says whether a (IPv4-mapped IPv6 read as IPv4) is published.
func (s Set) Contains(a netip.Addr) bool {
	a = a.Unmap()
	if _, ok := s.addrs[a]; ok {
		return true
	}
	if len(s.prefixes) == 0 || a.Zone() != "" {
		return false
	}
	_, ok := s.prefixes[cover(a)]
	return ok
}

// Len is the number of entries of the list.
func (s Set) Len() int { return len(s.addrs) + len(s.prefixes) }
