package localclusterset

import (
	"bufio"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echoServer answers each line with the same line, on loopback.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends one line over a new connection to addr and waits up to
// timeout for it to come back, returning how long that took.
func roundTrip(addr string, timeout time.Duration) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetDeadline(start.Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "ping\n" {
		return 0, errors.New("echoed " + line)
	}
	return time.Since(start), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestLinkFaultsAndHeal(t *testing.T) {
	s, err := newLinkServer(filepath.Join(t.TempDir(), "links.log"))
	require.NoError(t, err)
	t.Cleanup(s.close)
	l, err := s.add("test", []string{"127.0.0.1:0"}, []string{echoServer(t)})
	require.NoError(t, err)
	addr := l.Addr()

	tests := []struct {
		name  string
		fault func() error
		check func(t *testing.T, rtt time.Duration, err error)
	}{{
		name:  "a healthy link carries data",
		fault: func() error { return nil },
		check: func(t *testing.T, rtt time.Duration, err error) { require.NoError(t, err) },
	}, {
		name:  "a cut link refuses connections",
		fault: func() error { l.Cut(); return nil },
		check: func(t *testing.T, _ time.Duration, err error) {
			require.Error(t, err)
			assert.Contains(t, err.Error(), "refused")
		},
	}, {
		name:  "a blackholed link accepts and never answers",
		fault: l.Blackhole,
		check: func(t *testing.T, _ time.Duration, err error) {
			require.Error(t, err)
			assert.True(t, isTimeout(err), "want a timeout, got %v", err)
		},
	}, {
		name:  "latency delays the answer",
		fault: func() error { return l.Latency(300*time.Millisecond, 0) },
		check: func(t *testing.T, rtt time.Duration, err error) {
			require.NoError(t, err)
			assert.GreaterOrEqual(t, rtt, 300*time.Millisecond)
		},
	}, {
		name:  "reset_peer resets the connection",
		fault: func() error { return l.ResetPeer(0) },
		check: func(t *testing.T, _ time.Duration, err error) {
			require.Error(t, err)
			assert.False(t, isTimeout(err), "want a reset or EOF, got %v", err)
		},
	}, {
		name:  "limit_data closes the connection before the answer is whole",
		fault: func() error { return l.LimitData(2) },
		check: func(t *testing.T, _ time.Duration, err error) {
			require.Error(t, err)
			assert.False(t, isTimeout(err), "want EOF, got %v", err)
		},
	}, {
		name:  "bandwidth and slicer still deliver",
		fault: func() error { return errors.Join(l.Bandwidth(1), l.Slice(2, 1, time.Millisecond)) },
		check: func(t *testing.T, _ time.Duration, err error) { require.NoError(t, err) },
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.fault())
			rtt, err := roundTrip(addr, time.Second)
			tc.check(t, rtt, err)
			require.NoError(t, l.Heal())
			assert.Empty(t, l.Faults())
			// Healed, the same address carries data again.
			_, err = roundTrip(addr, 2*time.Second)
			require.NoError(t, err, "after heal")
		})
	}
}

func TestLinksRefuseAddressesOffLoopback(t *testing.T) {
	s, err := newLinkServer(filepath.Join(t.TempDir(), "links.log"))
	require.NoError(t, err)
	t.Cleanup(s.close)
	_, err = s.add("off", []string{"127.0.0.1:0"}, []string{"192.0.2.1:80"})
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "not a loopback address"), err.Error())
}
