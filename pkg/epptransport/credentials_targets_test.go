package epptransport_test

import (
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

// ns is the namespace of the pools and Secrets.
const ns = "example"

func TestCredentialsForTargets(t *testing.T) {
	serving := tlstest.NewServing(t, "127.0.0.1")
	good := epptransporttest.Secret(ns, "epp-creds", map[string][]byte{"ca.crt": serving.CAPEM})
	kube := kubefake.NewSimpleClientset(good)
	c := epptransporttest.Run(t, kube, ns)

	// targets are the addresses of one cluster's EPP, reached with the
	// Secret of secretNS when secret is set.
	table := func(secret string, secretNS string) []epptransport.Target {
		var pt eppaddr.PortTransport
		if secret != "" {
			pt = eppaddr.PortTransport{TLS: true, Secret: types.NamespacedName{Namespace: secretNS, Name: secret}}
		}
		return []epptransport.Target{
			{Addr: "127.0.2.1:9002", Cluster: "cluster-a", Port: eppaddr.PortExtProc, Transport: pt},
			{Addr: "127.0.2.1:9003", Cluster: "cluster-a", Port: eppaddr.PortHealth, Transport: pt},
			{Addr: "http://127.0.2.1:9090/metrics", Cluster: "cluster-a", Port: eppaddr.PortMetrics},
		}
	}

	t.Run("addresses without a Secret are plaintext", func(t *testing.T) {
		c.SetTargets(table("", ""))
		got, err := c.ForTarget("127.0.2.1:9002")
		require.NoError(t, err)
		assert.Nil(t, got.Config)
		assert.Empty(t, got.Version)
	})

	var first string
	t.Run("addresses with a Secret get its TLS configuration, at its version", func(t *testing.T) {
		c.SetTargets(table("epp-creds", ns))
		for _, target := range []string{"127.0.2.1:9002", "127.0.2.1:9003"} {
			got, err := c.ForTarget(target)
			require.NoError(t, err)
			require.NotNil(t, got.Config, target)
			assert.NotEmpty(t, got.Version)
			first = got.Version
		}
		got, err := c.ForTarget("http://127.0.2.1:9090/metrics")
		require.NoError(t, err)
		assert.Nil(t, got.Config, "the metrics address names no Secret")
	})

	t.Run("a changed Secret gives a new version", func(t *testing.T) {
		changed := good.DeepCopy()
		changed.Data["server-name"] = []byte("epp.example.svc")
		changed.ResourceVersion = "2"
		_, err := kube.CoreV1().Secrets(ns).Update(t.Context(), changed, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			got, err := c.ForTarget("127.0.2.1:9002")
			require.NoError(ct, err)
			assert.NotEqual(ct, first, got.Version)
			assert.Equal(ct, "epp.example.svc", got.Config.ServerName)
		}, 5*time.Second, 10*time.Millisecond)
	})

	t.Run("a missing Secret is an error that names it and its label", func(t *testing.T) {
		c.SetTargets(table("missing", ns))
		_, err := c.ForTarget("127.0.2.1:9002")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "127.0.2.1:9002")
		assert.Contains(t, err.Error(), "example/missing")
		assert.Contains(t, err.Error(), epptransport.CredentialsLabel+"=true does not exist")
	})

	t.Run("a Secret of a namespace the sidecar does not read is an error that names the flag", func(t *testing.T) {
		c.SetTargets(table("epp-creds", "other"))
		_, err := c.ForTarget("127.0.2.1:9002")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--endpoint-picker-secret-namespaces")
	})

	t.Run("a Secret that appears is used at once", func(t *testing.T) {
		c.SetTargets(table("late", ns))
		_, err := c.ForTarget("127.0.2.1:9002")
		require.Error(t, err)
		_, err = kube.CoreV1().Secrets(ns).Create(t.Context(), epptransporttest.Secret(ns, "late", map[string][]byte{"ca.crt": serving.CAPEM}), metav1.CreateOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			_, err := c.ForTarget("127.0.2.1:9002")
			assert.NoError(ct, err)
		}, 5*time.Second, 10*time.Millisecond)
	})

	t.Run("an address two clusters name with and without a Secret is reached with TLS", func(t *testing.T) {
		c.SetTargets(append(table("epp-creds", ns), epptransport.Target{Addr: "127.0.2.1:9002", Cluster: "cluster-c", Port: eppaddr.PortExtProc}))
		got, err := c.ForTarget("127.0.2.1:9002")
		require.NoError(t, err)
		assert.NotNil(t, got.Config)
	})

	t.Run("nil credentials reach everything in plaintext", func(t *testing.T) {
		var none *epptransport.Credentials
		none.SetTargets(table("epp-creds", ns))
		got, err := none.ForTarget("127.0.2.1:9002")
		require.NoError(t, err)
		assert.Nil(t, got.Config)
	})
}
