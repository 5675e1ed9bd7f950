package clusterset

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// A member's streams are read uncompressed, over HTTP/2 as a member's
// aggregator serves them: a gzip-encoded watch held a decompressor and its
// window for as long as it lived, more heap per member than its summaries.
// And the clientsets only full mode reads with are not made for a member
// until it is read in full mode.
func TestAMemberIsReadUncompressedAndWithoutFullModeClientsets(t *testing.T) {
	var (
		mu        sync.Mutex
		encodings []string
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		encodings = append(encodings, r.Proto+" "+r.URL.Path+": "+r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		http.NotFound(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	m, err := newMember("m", "", &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, 1<<20, func(Event) {})
	require.NoError(t, err)
	assert.Nil(t, m.kube, "the Kubernetes clientset, before full mode")
	assert.Nil(t, m.gateway, "the Gateway API clientset, before full mode")
	assert.Nil(t, m.mci, "mci's clientset, before full mode")

	_ = m.probe(t.Context(), m.probeClient, thresholds{})
	_, _ = m.summaryClient.InferencePoolExportSummaries("").List(t.Context(), metav1.ListOptions{})
	_, _ = m.readClusterID(t.Context())
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, encodings, 3)
	for _, e := range encodings {
		assert.Regexp(t, `^HTTP/2\.0 /[^:]*: $`, e, "a request asked for a compressed answer")
	}

	require.NoError(t, m.objectClients())
	assert.NotNil(t, m.kube)
	assert.NotNil(t, m.gateway)
	assert.NotNil(t, m.mci)
}
