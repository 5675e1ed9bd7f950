package clusterset

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/klog/v2"
)

// A member's version is raised to what all its informers have handled,
// never lowered, and a version that cannot be read raises nothing.
func TestAMembersVersionIsRaisedToWhatEveryInformerHasHandled(t *testing.T) {
	type told struct {
		informer int
		rv       string
	}
	tests := []struct {
		name string
		told []told
		want []uint64
	}{{
		name: "nothing is raised until every informer has listed",
		told: []told{{0, "10"}, {0, "12"}},
		want: nil,
	}, {
		name: "the first lists raise it to the lower of their versions",
		told: []told{{0, "12"}, {1, "10"}},
		want: []uint64{10},
	}, {
		name: "a bookmark of one informer raises it as far as the other has handled",
		told: []told{{0, "10"}, {1, "10"}, {1, "15"}, {0, "20"}},
		want: []uint64{10, 15},
	}, {
		name: "an older version told late lowers nothing",
		told: []told{{0, "10"}, {1, "20"}, {0, "30"}, {1, "5"}, {0, "8"}},
		want: []uint64{10, 20},
	}, {
		name: "a version that cannot be read is skipped",
		told: []told{{0, "10"}, {1, "not-a-version"}, {1, "0"}, {1, "11"}},
		want: []uint64{10},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var raised []uint64
			p := newMemberProgress(2, func(rv string) (uint64, error) { return strconv.ParseUint(rv, 10, 64) }, func(v uint64) { raised = append(raised, v) }, klog.Background())
			for _, e := range tt.told {
				p.of(e.informer)(e.rv)
			}
			assert.Equal(t, tt.want, raised)
		})
	}
}
