package epptransport_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/epptransport/epptransporttest"
	"github.com/mci-dev/mci/test/tlstest"
)

// fakeConn is a connection of a Conns, named by its address and the
// version of its credentials.
type fakeConn struct {
	name   string
	closed bool
}

// recorder makes and closes fakeConns.
type recorder struct {
	mu    sync.Mutex
	made  []*fakeConn
	fails map[string]bool
}

func (r *recorder) dial(addr string, t *epptransport.EndpointTLS) (*fakeConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fails[addr] {
		return nil, fmt.Errorf("cannot dial %s", addr)
	}
	c := &fakeConn{name: addr + "@" + t.Version}
	r.made = append(r.made, c)
	return c, nil
}

func (r *recorder) close(c *fakeConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.closed = true
}

func (r *recorder) isClosed(c *fakeConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return c.closed
}

func TestConnsKeepOneConnectionPerAddressAndCredentials(t *testing.T) {
	serving := tlstest.NewServing(t, "127.0.0.1")
	secret := epptransporttest.Secret(ns, "epp-creds", map[string][]byte{"ca.crt": serving.CAPEM})
	kube := kubefake.NewSimpleClientset(secret)
	creds := epptransporttest.Run(t, kube, ns)
	const a, b = "127.0.2.1:9002", "127.0.2.2:9002"
	creds.SetTargets([]epptransport.Target{
		{Addr: a, Cluster: "cluster-a", Port: eppaddr.PortExtProc, Transport: eppaddr.PortTransport{TLS: true, Secret: types.NamespacedName{Namespace: ns, Name: "epp-creds"}, Namespace: ns}},
		{Addr: b, Cluster: "cluster-b", Port: eppaddr.PortExtProc},
	})

	t.Run("a connection is made once per address and reused", func(t *testing.T) {
		r := &recorder{}
		conns := epptransport.NewConns(creds, 0, r.dial, r.close)
		first, err := conns.Get(a)
		require.NoError(t, err)
		again, err := conns.Get(a)
		require.NoError(t, err)
		assert.Same(t, first, again)
		other, err := conns.Get(b)
		require.NoError(t, err)
		assert.NotSame(t, first, other)
		assert.Len(t, r.made, 2)
	})

	t.Run("changed credentials make a new connection and release the old one after the grace period", func(t *testing.T) {
		r := &recorder{}
		conns := epptransport.NewConns(creds, 300*time.Millisecond, r.dial, r.close)
		old, err := conns.Get(a)
		require.NoError(t, err)
		rotated := secret.DeepCopy()
		rotated.Data["server-name"] = []byte("epp.example.svc")
		rotated.ResourceVersion = "2"
		_, err = kube.CoreV1().Secrets(ns).Update(t.Context(), rotated, metav1.UpdateOptions{})
		require.NoError(t, err)
		var next *fakeConn
		require.Eventually(t, func() bool {
			next, err = conns.Get(a)
			return err == nil && next != old
		}, 5*time.Second, 10*time.Millisecond)
		assert.False(t, r.isClosed(old), "open for the streams still using it")
		assert.Eventually(t, func() bool { return r.isClosed(old) }, 5*time.Second, 10*time.Millisecond, "closed after the grace period")
		assert.False(t, r.isClosed(next))
	})

	t.Run("a failed dial keeps nothing", func(t *testing.T) {
		r := &recorder{fails: map[string]bool{b: true}}
		conns := epptransport.NewConns(creds, 0, r.dial, r.close)
		_, err := conns.Get(b)
		require.ErrorContains(t, err, "cannot dial")
		called := false
		conns.With(b, func(*fakeConn) { called = true })
		assert.False(t, called)
	})

	t.Run("retained, forgotten and closed connections", func(t *testing.T) {
		r := &recorder{}
		conns := epptransport.NewConns(creds, 0, r.dial, r.close)
		ca, err := conns.Get(a)
		require.NoError(t, err)
		cb, err := conns.Get(b)
		require.NoError(t, err)
		conns.Retain(func(addr string) bool { return addr == a })
		assert.True(t, r.isClosed(cb), "not retained")
		assert.False(t, r.isClosed(ca))
		seen := 0
		conns.With(a, func(c *fakeConn) { seen++ })
		assert.Equal(t, 1, seen)
		conns.Forget(a)
		assert.True(t, r.isClosed(ca))
		again, err := conns.Get(a)
		require.NoError(t, err)
		assert.NotSame(t, ca, again, "made anew after Forget")
		conns.Close()
		assert.True(t, r.isClosed(again))
	})

	t.Run("an address whose credentials cannot be had gets no connection", func(t *testing.T) {
		creds.SetTargets([]epptransport.Target{{Addr: a, Cluster: "cluster-a", Port: eppaddr.PortExtProc, Transport: eppaddr.PortTransport{TLS: true, Secret: types.NamespacedName{Namespace: ns, Name: "missing"}, Namespace: ns}}})
		r := &recorder{}
		_, err := epptransport.NewConns(creds, 0, r.dial, r.close).Get(a)
		require.ErrorContains(t, err, "example/missing")
		assert.Empty(t, r.made)
	})
}
