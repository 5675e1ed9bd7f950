package localclusterset

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFreePortsAreDistinctBindableAndOutsideTheEphemeralRange(t *testing.T) {
	ports, err := FreePorts(40)
	require.NoError(t, err)
	require.Len(t, ports, 40)
	seen := map[int]bool{}
	low := ephemeralPortsStart()
	for _, p := range ports {
		assert.False(t, seen[p], "port %d returned twice", p)
		seen[p] = true
		assert.GreaterOrEqual(t, p, reservedPortsFloor)
		assert.Less(t, p, low, "port %d is in the ephemeral range, where an outgoing connection can take it before the server binds it", p)
		l, err := net.Listen("tcp", hostPort(p))
		if assert.NoError(t, err, "port %d is free once FreePorts returns", p) {
			_ = l.Close()
		}
	}
}

// ClusterSets started side by side by one process bind their ports only
// later: the calls that chose them must not have chosen the same port.
// 100 calls of 40 take 4,000 of the 17,000-odd ports: chosen at random
// without the memory of what was handed out, some would repeat.
func TestFreePortsNeverHandsOutAPortTwiceInOneProcess(t *testing.T) {
	results := make([][]int, 100)
	done := make(chan struct{})
	for i := range results {
		go func() {
			defer func() { done <- struct{}{} }()
			ports, err := FreePorts(40)
			assert.NoError(t, err)
			results[i] = ports
		}()
	}
	for range results {
		<-done
	}
	seen := map[int]bool{}
	for _, ports := range results {
		require.Len(t, ports, 40)
		for _, p := range ports {
			assert.False(t, seen[p], "port %d handed out twice", p)
			seen[p] = true
		}
	}
}
