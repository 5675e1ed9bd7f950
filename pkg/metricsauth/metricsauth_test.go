package metricsauth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("metrics")) })

func get(t *testing.T, h http.Handler, path, token string) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

func TestStatic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(path, []byte("scraper-token,scraper,1\n"), 0o600))
	f, err := Static(path, klog.Background())
	require.NoError(t, err)
	h := f.Wrap(ok)
	tests := []struct {
		name  string
		token string
		want  int
	}{
		{name: "no token is 401", want: http.StatusUnauthorized},
		{name: "an unknown token is 401", token: "other", want: http.StatusUnauthorized},
		{name: "a token of the file is let in", token: "scraper-token", want: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, get(t, h, "/metrics", tt.token))
		})
	}
	_, err = Static(filepath.Join(t.TempDir(), "missing.csv"), klog.Background())
	assert.Error(t, err)
}

// TestDelegating checks what the filter asks the cluster and how it reads
// the answers. The cluster's side is an HTTP server answering the two
// review APIs as a kube-apiserver does (the delegating clients use the
// REST client directly, which client-go's fake clientset does not serve);
// the e2e tests use a real kube-apiserver.
func TestDelegating(t *testing.T) {
	var mu sync.Mutex
	var reviews []authorizationv1.SubjectAccessReviewSpec
	apiserver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var out any
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			tr := &authenticationv1.TokenReview{}
			require.NoError(t, json.NewDecoder(r.Body).Decode(tr))
			switch tr.Spec.Token {
			case "reader-token":
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "system:serviceaccount:example:reader"}}
			case "other-token":
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "system:serviceaccount:example:other"}}
			}
			out = tr
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			sar := &authorizationv1.SubjectAccessReview{}
			require.NoError(t, json.NewDecoder(r.Body).Decode(sar))
			mu.Lock()
			reviews = append(reviews, sar.Spec)
			mu.Unlock()
			sar.Status.Allowed = sar.Spec.User == "system:serviceaccount:example:reader" &&
				sar.Spec.NonResourceAttributes != nil && sar.Spec.NonResourceAttributes.Path == "/metrics" && sar.Spec.NonResourceAttributes.Verb == "get"
			out = sar
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer apiserver.Close()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: apiserver.URL})
	require.NoError(t, err)
	f, err := Delegating(kube, klog.Background())
	require.NoError(t, err)
	h := f.Wrap(ok)
	tests := []struct {
		name  string
		path  string
		token string
		want  int
	}{
		{name: "no token is 401", path: "/metrics", want: http.StatusUnauthorized},
		{name: "a token the cluster does not know is 401", path: "/metrics", token: "forged", want: http.StatusUnauthorized},
		{name: "a user without get on /metrics is 403", path: "/metrics", token: "other-token", want: http.StatusForbidden},
		{name: "a user with get on /metrics is let in", path: "/metrics", token: "reader-token", want: http.StatusOK},
		{name: "the path asked about is the request's", path: "/metrics/other", token: "reader-token", want: http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, get(t, h, tt.path, tt.token))
		})
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, reviews)
	assert.Nil(t, reviews[0].ResourceAttributes, "a non-resource request")
}
