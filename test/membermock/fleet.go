package membermock

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apiserver"
	generatedopenapi "github.com/mci-dev/mci/pkg/generated/openapi"
	"github.com/mci-dev/mci/pkg/registry/inference/inferenceclustersummary"
	"github.com/mci-dev/mci/pkg/registry/inference/inferencepoolexportsummary"
	"github.com/mci-dev/mci/pkg/registry/virtual"
	"github.com/mci-dev/mci/pkg/version"
)

// Options configure a Fleet.
type Options struct {
	// ClusterSetName is the ClusterSet's name, as every member's
	// mci-apiserver is given it.
	ClusterSetName string
	// Reader names the cluster whose mci-apiserver reads the members: the
	// identity each member's token stands for carries the group
	// mci.x-k8s.io:member:<Reader>, as the identities members hand out
	// per reader do. Empty: the shared reader identity, which names no
	// member (it is sent the exports that are not scoped only).
	Reader string
	// HistorySize is each member's watch history, in changes; the
	// default of mci-apiserver when 0.
	HistorySize int
	// ReaderLabels are the labels every member knows each reader by.
	ReaderLabels map[string]map[string]string
}

// readerUser is the name of the identity members' tokens stand for, as a
// real member's summary reader is named.
const readerUser = "mci-member-reader"

// Fleet serves the summary API of its members. One generic API server
// (mci's scheme, codecs and summary storage) answers for all of them;
// each member has a listener of its own, and a request reaches the
// member of the listener it came in on.
type Fleet struct {
	opts    Options
	generic *genericapiserver.GenericAPIServer
	ctx     context.Context

	mu      sync.RWMutex
	members map[string]*served

	// reads counts what readers asked of the summaries, fleet-wide.
	reads readCounts
}

// served is a member with what serves it.
type served struct {
	*Member
	token  string
	tls    *servingTLS
	addr   string
	server *http.Server
}

type memberKey struct{}

// NewFleet builds the fleet's API server; Run serves it.
func NewFleet(opts Options) (*Fleet, error) {
	f := &Fleet{opts: opts, members: map[string]*served{}}
	config := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	config.EffectiveVersion = version.Served(utilcompatibility.DefaultBuildEffectiveVersion())
	config.Authentication.Authenticator = bearertoken.New(authenticator.TokenFunc(f.authenticate))
	config.Authorization.Authorizer = summaryReaderAuthorizer
	// No listener of its own: the members' listeners serve its handler.
	// The OpenAPI of mci-apiserver, which the API machinery needs for its
	// field managers.
	namer := openapi.NewDefinitionNamer(apiserver.Scheme)
	config.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(generatedopenapi.GetOpenAPIDefinitions, namer)
	config.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(generatedopenapi.GetOpenAPIDefinitions, namer)
	config.ExternalAddress = "127.0.0.1:443"
	config.LoopbackClientConfig = &restclient.Config{Host: "https://127.0.0.1"}
	generic, err := config.Complete().New("membermock", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	if err := f.install(generic); err != nil {
		return nil, err
	}
	f.generic = generic
	return f, nil
}

// install serves the summary resources, each request from its member's
// storage, and what else a reader asks a member (memberinfo.go).
func (f *Fleet) install(generic *genericapiserver.GenericAPIServer) error {
	ready := func() error { return nil }
	exports := virtual.NewREST(virtual.NewStore(inferencepoolexportsummary.Resource{}, nil, inferencepoolexportsummary.Describe().New), inferencepoolexportsummary.Describe(), ready)
	clusters := virtual.NewREST(virtual.NewStore(inferenceclustersummary.Resource{}, nil, inferenceclustersummary.Describe().New), inferenceclustersummary.Describe(), ready)
	group := genericapiserver.NewDefaultAPIGroupInfo(inference.GroupName, apiserver.Scheme, metav1.ParameterCodec, apiserver.Codecs)
	group.VersionedResourcesStorageMap["v1alpha1"] = map[string]rest.Storage{
		"inferencepoolexportsummaries": &memberREST{REST: exports, fleet: f, of: func(m *Member) *virtual.REST { return m.exportsREST }},
		"inferenceclustersummaries":    &memberREST{REST: clusters, fleet: f, of: func(m *Member) *virtual.REST { return m.clustersREST }},
	}
	if err := generic.InstallAPIGroup(&group); err != nil {
		return fmt.Errorf("installing the %s API group: %w", inference.GroupName, err)
	}
	installMemberInfo(generic.Handler.NonGoRestfulMux, f.memberOf)
	return nil
}

// Run serves the fleet until ctx ends; members join with Join.
func (f *Fleet) Run(ctx context.Context) error {
	prepared := f.generic.PrepareRun()
	f.mu.Lock()
	f.ctx = ctx
	f.mu.Unlock()
	failed := make(chan error, 1)
	// The generic server runs its hooks and lifecycle without a listener
	// of its own; its graceful termination waits for that listener to stop
	// and never returns, so it is not waited for.
	go func() { failed <- prepared.RunWithContext(ctx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-failed:
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.members {
		m.stopLocked()
	}
	return err
}

// running reports whether Run has started.
func (f *Fleet) running() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.ctx != nil
}

// memberOf is the member a request came to.
func (f *Fleet) memberOf(ctx context.Context) (*served, error) {
	m, ok := ctx.Value(memberKey{}).(*served)
	if !ok {
		return nil, errors.New("the request reached no member")
	}
	return m, nil
}

// authenticate accepts the token of the member the request came to, and
// no other: a member's kube-apiserver knows its own tokens only.
func (f *Fleet) authenticate(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	m, err := f.memberOf(ctx)
	if err != nil {
		return nil, false, err
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(m.token)) != 1 {
		return nil, false, errors.New("invalid bearer token")
	}
	groups := []string{user.AllAuthenticated}
	if f.opts.Reader != "" {
		groups = append(groups, inferencepoolexportsummary.MemberGroupPrefix+f.opts.Reader)
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: readerUser, Groups: groups}}, true, nil
}

// ErrNotRunning: a member joins a fleet once Run has started.
var ErrNotRunning = errors.New("the fleet is not running")

// Join adds member name, serving at a loopback port of its own from now
// on. Its objects are added with Apply.
func (f *Fleet) Join(name string) (*Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx == nil {
		return nil, ErrNotRunning
	}
	if _, ok := f.members[name]; ok {
		return nil, fmt.Errorf("member %s has joined already", name)
	}
	creds, err := newServingTLS(name)
	if err != nil {
		return nil, err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	m := &served{
		Member: NewMember(name, MemberOptions{ClusterSetName: f.opts.ClusterSetName, HistorySize: f.opts.HistorySize, ReaderLabels: f.opts.ReaderLabels}),
		token:  hex.EncodeToString(token),
		tls:    creds,
	}
	m.Start(f.ctx)
	if err := f.listen(m, "127.0.0.1:0"); err != nil {
		m.Stop()
		return nil, err
	}
	f.members[name] = m
	return m.Member, nil
}

// listen serves m at addr.
func (f *Fleet) listen(m *served, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.name, err)
	}
	m.addr = l.Addr().String()
	handler := f.generic.Handler
	m.server = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.reads.count(m, r)
			handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), memberKey{}, m)))
		}),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{m.tls.cert}, MinVersion: tls.VersionTLS12},
	}
	go func() { _ = m.server.ServeTLS(l, "", "") }()
	return nil
}

// Leave removes member name: its listener closes, and its watches end as a
// cluster's that leaves the network.
func (f *Fleet) Leave(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[name]
	if !ok {
		return fmt.Errorf("no member %s", name)
	}
	m.stopLocked()
	delete(f.members, name)
	return nil
}

// Restart restarts member name's mci-apiserver: its watches end, its
// stores start afresh from its objects (as a restarted server computes
// them again), and it serves at the same address again.
func (f *Fleet) Restart(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[name]
	if !ok {
		return fmt.Errorf("no member %s", name)
	}
	m.stopLocked()
	m.mu.Lock()
	m.renew(MemberOptions{ClusterSetName: f.opts.ClusterSetName, HistorySize: f.opts.HistorySize, ReaderLabels: f.opts.ReaderLabels})
	m.Start(f.ctx)
	m.mu.Unlock()
	return f.listen(m, m.addr)
}

func (m *served) stopLocked() {
	if m.server != nil {
		_ = m.server.Close()
	}
	m.Stop()
}

// Member returns member name, nil when it has not joined.
func (f *Fleet) Member(name string) *Member {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if m, ok := f.members[name]; ok {
		return m.Member
	}
	return nil
}

// Names lists the members, sorted.
func (f *Fleet) Names() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	names := make([]string, 0, len(f.members))
	for n := range f.members {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Kubeconfig is member name's kubeconfig for the reader: its address,
// its CA and its token.
func (f *Fleet) Kubeconfig(name string) ([]byte, error) {
	f.mu.RLock()
	m, ok := f.members[name]
	f.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("no member %s", name)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: "https://" + m.addr, CertificateAuthorityData: m.tls.caPEM}
	cfg.AuthInfos[readerUser] = &clientcmdapi.AuthInfo{Token: m.token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: readerUser}
	cfg.CurrentContext = name
	return clientcmd.Write(*cfg)
}

// RESTConfig is member name's client configuration for the reader.
func (f *Fleet) RESTConfig(name string) (*restclient.Config, error) {
	data, err := f.Kubeconfig(name)
	if err != nil {
		return nil, err
	}
	return clientcmd.RESTConfigFromKubeConfig(data)
}

// WriteKubeconfigs writes every member's kubeconfig into dir as
// <member>.kubeconfig, as mci-apiserver's --member-kubeconfig-dir reads
// them (the file name is the cluster name).
func (f *Fleet) WriteKubeconfigs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, name := range f.Names() {
		data, err := f.Kubeconfig(name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name+".kubeconfig"), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}
