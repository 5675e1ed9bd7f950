package clusterset

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/credexpiry"
	"github.com/mci-dev/mci/pkg/imports"
)

// Reasons a member rejects this server's credentials, as the
// mci_clusterset_member_credentials_rejected metric names them.
const (
	// rejectedUnauthorized: the member answered 401 to any request (its
	// probe, a list, a watch): it does not accept the credentials at all
	// (expired, revoked, or another cluster's).
	rejectedUnauthorized = "unauthorized"
	// rejectedForbidden: the member answered 403 to its probe or to a list
	// or watch this server needs: the credentials are accepted but may not
	// read what mci reads (a role binding removed or never made).
	rejectedForbidden = "forbidden"
)

var rejectionReasons = []string{rejectedUnauthorized, rejectedForbidden}

// Kinds of credential whose expiry is exported.
const (
	// credentialToken: a bearer token that is a JWT (a ServiceAccount
	// token, or an OIDC or cloud token an exec plugin hands over): its
	// exp claim, read off what is sent.
	credentialToken = "token"
	// credentialClientCertificate: an inline client certificate's
	// NotAfter.
	credentialClientCertificate = "client-certificate"
)

var credentialKinds = []string{credentialToken, credentialClientCertificate}

// Sources of a credential whose expiry is exported: who renews it.
const (
	// sourceInline: the kubeconfig holds it (a Secret's, a file's):
	// someone must rotate the kubeconfig before it expires.
	sourceInline = "inline"
	// sourceFile: client-go reads it from a file named in the kubeconfig
	// (a projected ServiceAccount token, a certificate a certificate
	// manager renews), again as it changes: whatever writes the file
	// renews it.
	sourceFile = "file"
	// sourcePlugin: an exec plugin hands it over, and client-go runs the
	// plugin again before the expirationTimestamp the plugin gave and at a
	// 401: the plugin renews it.
	sourcePlugin = "plugin"
)

// expiry is when a credential sent expires, and who renews it.
type expiry struct {
	at     time.Time
	source string
}

// forbiddenRetention is how long a 403 on a list or watch counts without
// being answered again: client-go's reflectors retry a failed list at
// least every 30 s (their backoff's cap), so a path that stops being
// asked (its informer stopped: a namespace that no longer holds pools)
// does not flag the member for good.
const forbiddenRetention = 2 * time.Minute

// credentials follows what a member says of this server's credentials: it
// sees every response of the member's clients (the probe's, the lists' and
// the watches'), and the bearer token each request carries. It also holds
// the member's inline credentials, so that a rotated Secret that changes
// nothing but them (its token, its client certificate and key, its CA
// bundle) swaps them in place (rotate): its wrapper of the member's
// transport sends the current token with each request, and every request
// goes through the current base transport, which holds the client
// certificate and CA; the member's watches go on.
type credentials struct {
	// onChange is told every change of the rejection, outside the lock.
	onChange func(prev, next *rejection)

	mu sync.Mutex
	// token is the bearer token sent, when the member's kubeconfig holds
	// one inline; "" when client-go sends another kind of credential.
	token string
	// swappable: token is sent by the credentials' wrapper, so rotate
	// changes it in place.
	swappable bool
	// tls is the member's client certificate, key and CA, when the
	// kubeconfig holds them inline (or holds no certificate and no CA
	// file): requests go through base, which rotate swaps for a transport
	// of the new ones. nil when client-go builds the TLS of the member's
	// connections on its own (files, plugins, insecure).
	tls  *tlsMaterial
	base *swappableTransport
	// unauthorized is when the member first answered 401 since it last
	// accepted the credentials; zero while it accepts them.
	unauthorized time.Time
	// forbidden is when each list or watch path was last answered 403,
	// and since when it has been.
	forbidden map[string]forbiddenPath
	current   *rejection
	// tokenSeen and tokenExpiry are the last bearer token sent (kept only
	// to notice a new one; never logged) and its exp claim.
	tokenSeen   string
	tokenExpiry time.Time
	certExpiry  time.Time
	// tokenSource and certSource say who renews the token and the client
	// certificate (sourceInline, sourceFile, sourcePlugin).
	tokenSource, certSource string
	// certFile is the client certificate client-go reads again as it
	// changes, when the kubeconfig names one: its NotAfter is read at
	// each scrape.
	certFile string
}

type forbiddenPath struct {
	since, last time.Time
}

// rejection is a member's refusal of this server's credentials.
type rejection struct {
	reason  string
	since   time.Time
	message string
}

// newCredentials sets config up to send its inline bearer token, and its
// inline client certificate and CA, through the returned credentials,
// which also see every response of the clients made from config. config
// must not be shared.
func newCredentials(config *rest.Config, onChange func(prev, next *rejection)) *credentials {
	c := &credentials{onChange: onChange, forbidden: map[string]forbiddenPath{}}
	c.certExpiry = credexpiry.Certificate(config.CertData)
	c.tokenSource, c.certSource = sourceInline, sourceInline
	switch {
	case config.ExecProvider != nil || config.AuthProvider != nil:
		c.tokenSource = sourcePlugin
	case config.BearerTokenFile != "":
		c.tokenSource = sourceFile
	}
	if len(config.CertData) == 0 && config.CertFile != "" {
		c.certFile, c.certSource = config.CertFile, sourceFile
	}
	if config.BearerToken != "" && config.BearerTokenFile == "" && config.ExecProvider == nil && config.AuthProvider == nil {
		c.token, c.swappable = config.BearerToken, true
		config.BearerToken = ""
	}
	// Innermost: client-go adds the Authorization header (a static token,
	// an exec plugin's) outside the WrapTransport chain, so the wrapper
	// sees what is sent, and adds the swappable token itself.
	config.Wrap(c.wrap)
	c.takeTLS(config)
	return c
}

// tlsMaterial is what of a member's TLS a rotation may change in place.
type tlsMaterial struct {
	ca, cert, key []byte
}

func tlsOf(config *rest.Config) tlsMaterial {
	return tlsMaterial{ca: config.CAData, cert: config.CertData, key: config.KeyData}
}

func (t tlsMaterial) equal(o tlsMaterial) bool {
	return bytes.Equal(t.ca, o.ca) && bytes.Equal(t.cert, o.cert) && bytes.Equal(t.key, o.key)
}

// takeTLS moves config's inline client certificate, key and CA into a
// base transport of the credentials' own, built by client-go as it
// would have built it from config, so that rotate can swap it. A config
// whose TLS client-go builds from files or a plugin, or that skips
// verification, is left as it is: client-go follows files and plugins on
// its own, and a change of any of it reconnects the member.
func (c *credentials) takeTLS(config *rest.Config) {
	if config.Transport != nil || config.ExecProvider != nil || config.AuthProvider != nil || config.Insecure ||
		config.CAFile != "" || config.CertFile != "" || config.KeyFile != "" {
		return
	}
	// Whether a server named without a scheme is reached over TLS depends
	// on the CA and certificate in config (rest.DefaultServerUrlFor): it
	// is decided, and written down, before they leave config.
	server, _, err := rest.DefaultServerUrlFor(config)
	if err != nil || server.Scheme != "https" {
		return
	}
	material := tlsOf(config)
	base := baseTransportConfig(config)
	rt, err := transportFor(base, material)
	if err != nil {
		// A certificate that does not parse: left to client-go, which
		// says so when the member's clients are made.
		return
	}
	c.tls, c.base = &material, &swappableTransport{rt: rt, config: base}
	config.Host = server.String()
	config.Transport = c.base
	config.TLSClientConfig = rest.TLSClientConfig{}
	config.Proxy, config.Dial = nil, nil
}

// baseTransportConfig is what of config, beside its certificate, key and
// CA, makes the transport that client-go would make from it.
func baseTransportConfig(config *rest.Config) transport.Config {
	base := transport.Config{
		TLS:                transport.TLSConfig{ServerName: config.ServerName, NextProtos: config.NextProtos},
		Proxy:              config.Proxy,
		DisableCompression: config.DisableCompression,
	}
	if config.Dial != nil {
		base.DialHolder = &transport.DialHolder{Dial: config.Dial}
	}
	return base
}

// transportFor is the transport client-go would make for base with
// material (its TLS configuration, the dialer, proxy and timeouts of its
// transport cache, HTTP/2 as client-go sets it up), and nothing else: the
// member's clients add authentication, their user agent and their
// wrappers around it. It is made here rather than by client-go's cache
// for one difference: the HPACK tables of the member's HTTP/2 connection.
// A connection keeps a table each way for its life, up to 4 KiB each by
// default, filled by the headers of the member's responses (their audit
// IDs among them) and of mci's requests (the bearer token among them).
// A member is asked little and mostly answers through watches that last
// minutes, so the tables would save a few hundred bytes a request at the
// price of several KiB held for every member.
func transportFor(base transport.Config, material tlsMaterial) (http.RoundTripper, error) {
	base.TLS.CAData, base.TLS.CertData, base.TLS.KeyData = material.ca, material.cert, material.key
	tlsConfig, err := transport.TLSConfigFor(&base)
	if err != nil {
		return nil, err
	}
	dial := (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if base.DialHolder != nil {
		dial = base.DialHolder.Dial
	}
	proxy := http.ProxyFromEnvironment
	if base.Proxy != nil {
		proxy = base.Proxy
	}
	return utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               proxy,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tlsConfig,
		MaxIdleConnsPerHost: 25,
		DialContext:         dial,
		DisableCompression:  base.DisableCompression,
		HTTP2: &http.HTTP2Config{
			MaxDecoderHeaderTableSize: headerTableBytes,
			MaxEncoderHeaderTableSize: headerTableBytes,
		},
	}), nil
}

// headerTableBytes is the size of a member connection's HPACK tables: no
// header field fits in it (each takes its length and 32 bytes), so every
// field is sent literally. Zero would mean the default to Go's HTTP/2.
const headerTableBytes = 1

// swappableTransport is a member's base transport: every request goes
// through the one it holds at the time, so a rotated client certificate
// or CA is used by every request from the swap on, while the requests in
// flight (the watches) go on over the connections of the transport they
// started with.
type swappableTransport struct {
	config transport.Config

	mu sync.RWMutex
	rt http.RoundTripper
}

func (s *swappableTransport) current() http.RoundTripper {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rt
}

func (s *swappableTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return s.current().RoundTrip(req)
}

// WrappedRoundTripper lets client-go's helpers (closing idle
// connections, say) reach the transport in use.
func (s *swappableTransport) WrappedRoundTripper() http.RoundTripper { return s.current() }

// swappableToken is the member's current bearer token, when it is sent
// by the credentials rather than by client-go.
func (c *credentials) swappableToken() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token, c.swappable
}

// rotate swaps in the inline credentials of config (a rotated kubeconfig
// of the member that differs from the one in use in nothing else: Cache.
// rotateInPlace checks that) and reports whether it could: only a member
// whose kubeconfig held them inline can. A new client certificate or CA
// comes with a new base transport, so every request from then on opens a
// connection of its own and presents the new certificate: reusing a
// connection opened with the old one (HTTP/2 carries every request of a
// member over one) would go on presenting the old certificate, which a
// kube-apiserver verifies at every request, not only at the handshake,
// and refuses once it is expired or its CA is no longer trusted. The
// requests in flight, the watches, are not cut: the kube-apiserver
// authenticated them when they started, as it did a watch opened with a
// rotated token; when they end they resume through the new transport.
// The old transport's idle connections are closed.
func (c *credentials) rotate(config *rest.Config) bool {
	material := tlsOf(config)
	c.mu.Lock()
	token := config.BearerToken
	switch {
	case token != "" && !c.swappable, token == "" && c.swappable:
		c.mu.Unlock()
		return false
	case c.tls == nil && (len(material.ca) > 0 || len(material.cert) > 0 || len(material.key) > 0):
		c.mu.Unlock()
		return false
	}
	var next http.RoundTripper
	if c.tls != nil && !c.tls.equal(material) {
		rt, err := transportFor(c.base.config, material)
		if err != nil {
			c.mu.Unlock()
			return false
		}
		next = rt
	}
	if c.swappable {
		c.token = token
	}
	var prev http.RoundTripper
	if next != nil {
		c.tls = &material
		c.certExpiry = credexpiry.Certificate(material.cert)
		c.base.mu.Lock()
		prev, c.base.rt = c.base.rt, next
		c.base.mu.Unlock()
	}
	c.mu.Unlock()
	if prev != nil && prev != next {
		utilnet.CloseIdleConnectionsFor(prev)
	}
	return true
}

// wrap is a rest.Config WrapTransport: it sends the swappable token and
// observes every request and its answer.
func (c *credentials) wrap(rt http.RoundTripper) http.RoundTripper {
	return credentialsTransport{creds: c, next: rt}
}

type credentialsTransport struct {
	creds *credentials
	next  http.RoundTripper
}

// RoundTrip sends the swappable token with a request that carries no
// other credential, as client-go's token source transport would. It does
// so itself for the memory: that transport's response body keeps both the
// request it was given and its copy with the token for as long as the
// body is read, and a watch's body is read for minutes, two a member.
func (t credentialsTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if token, ok := t.creds.swappableToken(); ok && req.Header.Get("Authorization") == "" {
		req = utilnet.CloneRequest(req)
		req.Header.Set("Authorization", "Bearer "+token)
	}
	t.creds.sent(req.Header.Get("Authorization"))
	resp, err := t.next.RoundTrip(req)
	if err == nil {
		t.creds.answered(req, resp.StatusCode, time.Now())
	}
	return resp, err
}

// sent reads the expiry of the bearer token a request carries, when it is
// a JWT, once per token. The token is parsed, not verified: the member
// verifies it; this is only to say when it will stop doing so.
func (c *credentials) sent(authorization string) {
	token, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if token == c.tokenSeen {
		return
	}
	c.tokenSeen, c.tokenExpiry = token, credexpiry.JWT(token)
}

// expiries returns the known expiry of each kind of credential sent, and
// who renews it; a kind that is not sent, or whose expiry cannot be read,
// is absent. A certificate an exec plugin hands over cannot be read: it
// is in the TLS handshake client-go makes, nowhere mci sees it.
func (c *credentials) expiries() map[string]expiry {
	var fileExpiry time.Time
	if c.certFile != "" {
		// Read as client-go reads it, at each use: the file changes.
		if data, err := os.ReadFile(c.certFile); err == nil {
			fileExpiry = credexpiry.Certificate(data)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]expiry{}
	if !c.tokenExpiry.IsZero() {
		out[credentialToken] = expiry{at: c.tokenExpiry, source: c.tokenSource}
	}
	switch {
	case !fileExpiry.IsZero():
		out[credentialClientCertificate] = expiry{at: fileExpiry, source: c.certSource}
	case !c.certExpiry.IsZero():
		out[credentialClientCertificate] = expiry{at: c.certExpiry, source: c.certSource}
	}
	return out
}

// answered records the status of a response. 401 always means the
// credentials are refused; 403 only for the probe and for lists and
// watches, which mci cannot do without: a forbidden get of one object
// (the cluster ID's Namespace) is a missing permission handled where it
// is asked (identity.go).
func (c *credentials) answered(req *http.Request, status int, now time.Time) {
	c.mu.Lock()
	prev := c.current
	path := req.URL.Path
	switch {
	case status == http.StatusUnauthorized:
		if c.unauthorized.IsZero() {
			c.unauthorized = now
		}
	case status == http.StatusForbidden:
		c.unauthorized = time.Time{}
		if needed(req) {
			f := c.forbidden[path]
			if f.since.IsZero() {
				f.since = now
			}
			f.last = now
			c.forbidden[path] = f
		}
	case status < http.StatusBadRequest:
		c.unauthorized = time.Time{}
		delete(c.forbidden, path)
	}
	next := c.assessLocked(now)
	c.mu.Unlock()
	if !sameRejection(prev, next) {
		c.onChange(prev, next)
	}
}

// assessLocked works out the rejection from what the member answered,
// keeping the current one (and its start) while its reason holds.
func (c *credentials) assessLocked(now time.Time) *rejection {
	for path, f := range c.forbidden {
		if now.Sub(f.last) > forbiddenRetention {
			delete(c.forbidden, path)
		}
	}
	var next *rejection
	switch {
	case !c.unauthorized.IsZero():
		msg := "it answers 401 Unauthorized: it does not accept this server's credentials (expired, revoked or not its own)"
		if !c.tokenExpiry.IsZero() && !c.tokenExpiry.After(now) {
			msg = fmt.Sprintf("it answers 401 Unauthorized: the token this server sends expired at %s", c.tokenExpiry.UTC().Format(time.RFC3339))
		}
		next = &rejection{reason: rejectedUnauthorized, since: c.unauthorized, message: msg}
	case len(c.forbidden) > 0:
		paths := make([]string, 0, len(c.forbidden))
		since := now
		for path, f := range c.forbidden {
			paths = append(paths, path)
			if f.since.Before(since) {
				since = f.since
			}
		}
		slices.Sort(paths)
		next = &rejection{reason: rejectedForbidden, since: since, message: "it answers 403 Forbidden: this server's credentials may not read " + strings.Join(paths, ", ")}
	}
	if next != nil && c.current != nil && c.current.reason == next.reason && c.current.message == next.message {
		next = c.current
	}
	c.current = next
	return next
}

func sameRejection(a, b *rejection) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.reason == b.reason && a.message == b.message
}

// rejected returns the member's refusal of the credentials, nil while it
// accepts them.
func (c *credentials) rejected() *rejection {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// needed reports whether a request is one mci cannot do without: the
// probe, or a list or watch (a read of a collection, by its path: a
// cluster-scoped collection, the Namespaces' included, or a namespaced
// one).
func needed(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	if req.URL.Path == "/readyz" {
		return true
	}
	var rest []string
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return false
	}
	if len(rest) >= 2 && rest[0] == "namespaces" {
		// namespaces/NAME is one Namespace; namespaces/NAME/RESOURCE a
		// namespaced collection. Pods mci can do without: a member whose
		// credentials may not list them publishes no endpoint addresses
		// (podaccess.go).
		return len(rest) == 3 && rest[2] != "pods"
	}
	return len(rest) == 1
}

// credentialsChanged says a change of the member's rejection of its
// credentials, once, and recomputes what reads the member.
func (m *member) credentialsChanged(prev, next *rejection) {
	// Any request's answer tells, from the member's first (before
	// start has set its context): the logger is the process's.
	logger := klog.Background().WithValues("member", m.name)
	switch {
	case next != nil:
		logger.Info("Member rejects this server's credentials: its last known data is kept, flagged CredentialsRejected", "reason", next.reason, "since", next.since.UTC().Format(time.RFC3339), "message", next.message)
	default:
		logger.Info("Member accepts this server's credentials again", "rejectedFor", time.Since(prev.since).Round(time.Second))
	}
	m.handler(Event{Member: m.name, Kind: KindMember})
}

// credentialsFlag is the member's flag while it rejects its credentials
// and is otherwise reachable; nil while it accepts them.
func (m *member) credentialsFlag() *imports.Unreachable {
	r := m.credentials.rejected()
	if r == nil {
		return nil
	}
	return &imports.Unreachable{Since: r.since, Message: r.message + "; its last known data is kept", CredentialsRejected: true}
}

// credentialError reports whether a probe's error is the member refusing
// the credentials: an answer, so the member is reachable.
func credentialError(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
}
