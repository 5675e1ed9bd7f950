package virtual

import (
	"strings"
	"testing"
)

// FuzzParseVersion decodes arbitrary resourceVersions, as any client may
// send: decoding never panics, errors say what is wrong, and whatever
// decodes encodes back to a version that decodes to the same vector.
func FuzzParseVersion(f *testing.F) {
	f.Add("")
	f.Add("0")
	f.Add("%%")
	f.Add(Version{}.String())
	f.Add(Version{"cluster-a": 12, "cluster-b": 7, reachabilityComponent: 1700000000000, epochComponent: 1}.String())
	f.Add("djE7YT0")                            // "v1;a="
	f.Add("djE7YT0xOCw")                        // "v1;a=18,"
	f.Add("djE7YT0xODQ0Njc0NDA3MzcwOTU1MTYxNg") // "v1;a=18446744073709551616"
	f.Add("v2;a=")
	f.Add("v2;a=3w5e11264sgsg") // 2^64 in base 36
	f.Add("v2;a=1,,b=2")
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVersion(s)
		if err != nil {
			if v != nil {
				t.Fatalf("ParseVersion(%q) returned %v with error %v", s, v, err)
			}
			if !strings.Contains(err.Error(), "resourceVersion") {
				t.Fatalf("ParseVersion(%q): error %q does not name the resourceVersion", s, err)
			}
			return
		}
		enc := v.String()
		again, err := ParseVersion(enc)
		if err != nil {
			t.Fatalf("ParseVersion(%q) = %v, whose encoding %q does not decode: %v", s, v, enc, err)
		}
		if !again.Covers(v) || !v.Covers(again) || len(again) != len(v) {
			t.Fatalf("round trip of %q changed %v into %v", s, v, again)
		}
		if again.String() != enc {
			t.Fatalf("encoding of %v is not canonical: %q then %q", v, enc, again.String())
		}
	})
}

// FuzzVersionRoundTrips encodes vectors built from arbitrary component
// names (as member cluster names are) and values.
func FuzzVersionRoundTrips(f *testing.F) {
	f.Add("cluster-a", uint64(1), "cluster-b", uint64(0))
	f.Add(reachabilityComponent, uint64(1<<63), epochComponent, ^uint64(0))
	f.Fuzz(func(t *testing.T, k1 string, n1 uint64, k2 string, n2 uint64) {
		v := Version{}
		for _, c := range []struct {
			k string
			n uint64
		}{{k1, n1}, {k2, n2}} {
			// Component names are cluster names (DNS subdomains) or the
			// reserved ones; none holds the separators.
			if c.k == "" || strings.ContainsAny(c.k, ",=") {
				return
			}
			v[c.k] = c.n
		}
		got, err := ParseVersion(v.String())
		if err != nil {
			t.Fatalf("%v encoded as %q does not decode: %v", v, v.String(), err)
		}
		if len(got) != len(v) {
			t.Fatalf("round trip changed %v into %v", v, got)
		}
		for k, n := range v {
			if got[k] != n {
				t.Fatalf("round trip changed %v into %v", v, got)
			}
		}
	})
}
