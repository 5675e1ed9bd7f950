package epp

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseEndpoints reads --endpoints: an error gives no endpoints; each
// accepted endpoint is an IP address and a port from 1 to 65535, written
// the canonical way, which reads back as itself.
//
// Trusted input: the operator's command line.
func FuzzParseEndpoints(f *testing.F) {
	for _, s := range []string{"10.0.0.1:8000", "10.0.0.1:8000,10.0.0.2:8000", "[::1]:80", "::ffff:10.0.0.1:080",
		"[::ffff:10.0.0.1]:80", "10.0.0.1:+80", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1", "host:80", "[fe80::1%eth0]:80",
		":80", "10.0.0.1:", "", ",", "010.0.0.1:80", "10.0.0.1:18446744073709551617"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		list := strings.Split(s, ",")
		eps, err := ParseEndpoints(list)
		if err != nil {
			require.Nil(t, eps)
			return
		}
		require.Len(t, eps, len(list))
		for _, e := range eps {
			require.Equal(t, e.Name, e.Address)
			host, port, err := net.SplitHostPort(e.Address)
			require.NoError(t, err)
			ip := net.ParseIP(host)
			require.NotNil(t, ip, "address %q of %q", e.Address, s)
			p, err := strconv.Atoi(port)
			require.NoError(t, err)
			require.True(t, p >= 1 && p <= 65535, "port of %q", e.Address)
			require.Equal(t, net.JoinHostPort(ip.String(), strconv.Itoa(p)), e.Address, "not canonical")
			again, err := ParseEndpoints([]string{e.Address})
			require.NoError(t, err)
			require.Equal(t, e, again[0])
		}
	})
}
