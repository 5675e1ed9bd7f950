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
