package localclusterset

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tunnel asks the proxy for a tunnel to name:port and returns the
// connection and the proxy's answer.
func tunnel(t *testing.T, proxy *NameProxy, name, port string) (net.Conn, *bufio.Reader, int) {
	t.Helper()
	conn, err := net.Dial("tcp", proxy.ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n", name, port, name, port)
	require.NoError(t, err)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	return conn, r, resp.StatusCode
}

func TestNameProxyTunnelsOnlyToNamesItResolvesAndCutsThemWhenTheyStop(t *testing.T) {
	_, port, err := net.SplitHostPort(echoServer(t))
	require.NoError(t, err)
	proxy, err := StartNameProxy()
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	const name = "cluster-a.members.test"

	_, _, status := tunnel(t, proxy, name, port)
	assert.Equal(t, http.StatusBadGateway, status, "a name the table does not hold does not resolve")

	proxy.Resolve(name, "127.0.0.1")
	conn, r, status := tunnel(t, proxy, name, port)
	require.Equal(t, http.StatusOK, status)
	_, err = conn.Write([]byte("hello\n"))
	require.NoError(t, err)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello\n", line, "the tunnel reaches the address the name resolves to")

	proxy.Unresolve(name)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = r.ReadString('\n')
	var timeout net.Error
	assert.True(t, err != nil && !(errors.As(err, &timeout) && timeout.Timeout()), "a tunnel to a name that stopped resolving is closed, not left open: %v", err)
	_, _, status = tunnel(t, proxy, name, port)
	assert.Equal(t, http.StatusBadGateway, status)

	proxy.Resolve(name, "127.0.0.1")
	_, _, status = tunnel(t, proxy, name, port)
	assert.Equal(t, http.StatusOK, status, "the name resolves again")
}
