package install

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/equality"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/compact"
)

// TestCompactRoundTripsInternalTypes fills every internal type of the group
// with random values and checks that the encoding the virtual stores keep
// them in (package compact) gives them back unchanged: a field it missed
// would silently vanish from served objects.
func TestCompactRoundTripsInternalTypes(t *testing.T) {
	scheme := runtime.NewScheme()
	Install(scheme)
	f := fuzzer.FuzzerFor(metafuzzer.Funcs, rand.NewSource(1), serializer.NewCodecFactory(scheme))
	for name, typ := range scheme.KnownTypes(inference.SchemeGroupVersion) {
		if _, ok := typ.FieldByName("ObjectMeta"); !ok {
			continue // lists and options
		}
		t.Run(name, func(t *testing.T) {
			c := compact.New()
			for range 200 {
				obj, err := scheme.New(inference.SchemeGroupVersion.WithKind(name))
				require.NoError(t, err)
				f.Fill(obj)
				data, err := c.Encode(obj)
				require.NoError(t, err)
				got, err := scheme.New(inference.SchemeGroupVersion.WithKind(name))
				require.NoError(t, err)
				require.NoError(t, c.Decode(data, got))
				require.True(t, equality.Semantic.DeepEqual(obj, got), "%s comes back as it went:\n%#v\n%#v", name, obj, got)
			}
		})
	}
}
