// Package metricsauth protects a /metrics endpoint the way upstream
// Endpoint Pickers do by default (controller-runtime's metrics server with
// its authentication and authorization filters, --metrics-endpoint-auth):
// a request needs a bearer token that the cluster authenticates
// (TokenReview) and whose user may get the request's path as a
// non-resource URL (SubjectAccessReview). Without a token, or with one the
// cluster does not accept, the answer is 401; with a token whose user is
// not allowed, 403.
//
// The cluster's answers come from k8s.io/apiserver's delegating
// authenticator and authorizer, which cache them (CacheTTL). For tests and
// standalone use, Static reads tokens from a file in kube-apiserver's
// --token-auth-file format and lets every user it names in.
package metricsauth

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/token/tokenfile"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// CacheTTL is how long the cluster's answer about a token, and about what
// its user may do, is reused: a scrape every second costs one review per
// token per CacheTTL, and a revoked permission takes effect within it.
const CacheTTL = 10 * time.Second

// Filter checks the requests of a handler.
type Filter struct {
	authn  authenticator.Request
	authz  authorizer.Authorizer
	logger klog.Logger
}

// Delegating checks tokens and permissions with the cluster of client, as
// upstream EPPs do: the client's user needs create on
// authentication.k8s.io tokenreviews and authorization.k8s.io
// subjectaccessreviews.
func Delegating(client kubernetes.Interface, logger klog.Logger) (*Filter, error) {
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      options.DefaultAuthWebhookRetryBackoff(),
		CacheTTL:                 CacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             CacheTTL,
		DenyCacheTTL:              CacheTTL,
		WebhookRetryBackoff:       options.DefaultAuthWebhookRetryBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	return &Filter{authn: authn, authz: authz, logger: logger}, nil
}

// Static accepts the tokens of a CSV file in kube-apiserver's
// --token-auth-file format (token,user,uid,"group1,group2"), each user
// allowed everything. The file is read once.
func Static(path string, logger klog.Logger) (*Filter, error) {
	tokens, err := tokenfile.NewCSV(path)
	if err != nil {
		return nil, fmt.Errorf("metrics token file: %w", err)
	}
	return &Filter{authn: bearertoken.New(tokens), authz: authorizerfactory.NewAlwaysAllowAuthorizer(), logger: logger}, nil
}

// Wrap returns next behind the filter.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, ok, err := f.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil && f.logger.V(4).Enabled() {
				f.logger.V(4).Info("Refused a metrics request: authentication failed", "remote", r.RemoteAddr, "err", err)
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		decision, reason, err := f.authz.Authorize(r.Context(), authorizer.AttributesRecord{
			User:            resp.User,
			Verb:            strings.ToLower(r.Method),
			Path:            r.URL.Path,
			ResourceRequest: false,
		})
		if err != nil || decision != authorizer.DecisionAllow {
			if f.logger.V(4).Enabled() {
				f.logger.V(4).Info("Refused a metrics request: not authorized", "remote", r.RemoteAddr, "user", resp.User.GetName(), "reason", reason, "err", err)
			}
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s %s", resp.User.GetName(), strings.ToLower(r.Method), r.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
