// Package epptransporttest runs epptransport.Credentials for the tests of
// its package and of mci-sidecar.
package epptransporttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/epptransport"
)

// Secret is an EPP credentials Secret, labelled for the sidecar.
func Secret(namespace, name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{epptransport.CredentialsLabel: "true"}},
		Data:       data,
	}
}

// Run runs Credentials over client's Secrets of namespaces until the test
// ends, synced.
func Run(t *testing.T, client kubernetes.Interface, namespaces ...string) *epptransport.Credentials {
	t.Helper()
	c := epptransport.NewCredentials(client, namespaces, klog.Background())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	select {
	case <-c.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("the Secrets never synced")
	}
	return c
}
