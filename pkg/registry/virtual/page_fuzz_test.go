package virtual

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzDecodeContinue decodes arbitrary continue tokens, as any client may
// send: decoding never panics; a token is either refused with an error
// that says it is a continue token, or it names the version and the object
// the next page starts at, and encodes back to a token that decodes to the
// same.
func FuzzDecodeContinue(f *testing.F) {
	valid := continueToken{ResourceVersion: Version{"cluster-a": 12, epochComponent: 1}.String(), Namespace: "ns", Name: "a"}
	f.Add(valid.encode())
	f.Add(continueToken{ResourceVersion: "v2;", Name: "a"}.encode())
	f.Add("")
	f.Add("%%%")
	f.Add("e30")                                                               // {}
	f.Add("bnVsbA")                                                            // null
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"rv":"x"}`)))          // no name
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"rv":1,"name":"a"}`))) // wrong type
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"rv":"x","name":"a","ns":"../../etc"}`)))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"rv":"x","name":"a","extra":` + strings.Repeat("[", 10000) + `}`)))
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"rv":"x","name":"a"}`))) // padded
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := decodeContinue(s)
		if err != nil {
			if tok != (continueToken{}) {
				t.Fatalf("decodeContinue(%q) returned %+v with error %v", s, tok, err)
			}
			if !strings.Contains(err.Error(), "continue token") {
				t.Fatalf("decodeContinue(%q): error %q does not say what was wrong", s, err)
			}
			return
		}
		if tok.ResourceVersion == "" || tok.Name == "" {
			t.Fatalf("decodeContinue(%q) accepted an incomplete token %+v", s, tok)
		}
		again, err := decodeContinue(tok.encode())
		if err != nil || again != tok {
			t.Fatalf("token %+v does not round trip: %+v, %v", tok, again, err)
		}
		// What it names is only ever compared with stored keys and parsed
		// as a version, which refuses what this server did not issue.
		if _, err := ParseVersion(tok.ResourceVersion); err != nil && !strings.Contains(err.Error(), "resourceVersion") {
			t.Fatalf("the version of token %+v gives an unclear error: %v", tok, err)
		}
	})
}
