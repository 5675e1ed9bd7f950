package clusterset

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOnlyAKubeAPIServersResourceVersionsAreOrdered(t *testing.T) {
	for _, tc := range []struct {
		name string
		rv   string
		want uint64
		ok   bool
	}{
		{name: "an etcd revision", rv: "12345", want: 12345, ok: true},
		{name: "the largest int64", rv: strconv.FormatInt(math.MaxInt64, 10), want: math.MaxInt64, ok: true},
		{name: "past the int64 range", rv: strconv.FormatUint(math.MaxInt64+1, 10)},
		{name: "past the uint64 range", rv: "18446744073709551616"},
		{name: "zero", rv: "0"},
		{name: "empty", rv: ""},
		{name: "not a number", rv: "not-a-version"},
		{name: "negative", rv: "-5"},
		{name: "with a sign", rv: "+5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := memberResourceVersion(tc.rv)
			if !tc.ok {
				assert.Error(t, err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
