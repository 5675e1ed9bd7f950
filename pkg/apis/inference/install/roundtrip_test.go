package install

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/roundtrip"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
)

// TestRoundTripTypes fills every type of every version with random values
// and checks that encoding, decoding and converting through the internal
// version gives them back unchanged: a field the generated conversions miss,
// or one that is lost on the wire, fails here. The group has no defaults and
// no hand-written conversions, so ObjectMeta's fuzzer funcs are all it needs.
func TestRoundTripTypes(t *testing.T) {
	roundtrip.RoundTripTestForAPIGroup(t, Install, metafuzzer.Funcs)
}
