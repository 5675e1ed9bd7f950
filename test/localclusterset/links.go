package localclusterset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"k8s.io/client-go/rest"
)

// Link faults (Options.Links): a controllable TCP proxy on each link that
// matters, so that a test can cut, blackhole, slow down, throttle or reset
// one link while the others carry on, as a network partition or a slow
// WAN link does to one pair of clusters and not to the rest. The proxies
// are toxiproxy's, run as a library in the calling process (no toxiproxy
// server, no HTTP API): a Link is a small handle over one or more of its
// proxies, and each fault is one of its toxics.
//
// The links:
//   - MemberLink(watcher, member): every mci-apiserver replica of watcher
//     to member's kube-apiserver. The replicas of watcher get member
//     kubeconfigs of their own (MemberKubeconfigDir) that point at the
//     link, so cutting it partitions watcher from member while every other
//     cluster still sees member.
//   - ClientLink(cluster): a client to cluster's kube-apiserver, and so to
//     its aggregator; ClientConfig returns a client configuration that
//     goes through it.
//   - EPPLink(cluster), with a data path: the EPP Service address that
//     mci-sidecar dials (ext_proc, gRPC health and metrics ports) to the
//     EPP, which then listens on an address of its own.

// Link is one controllable TCP link: one proxy per port it carries, all
// given the same faults. Its methods are safe for concurrent use.
type Link struct {
	// Name says what the link joins, e.g. "cluster-b->cluster-a".
	Name string

	mu      sync.Mutex
	proxies []*toxiproxy.Proxy
	cut     bool
}

// linkServer holds the proxies of a ClusterSet's links: toxiproxy's
// in-process proxy collection and its logger.
type linkServer struct {
	server *toxiproxy.ApiServer
	log    *os.File
	links  map[string]*Link
}

func newLinkServer(logPath string) (*linkServer, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("link log: %w", err)
	}
	logger := zerolog.New(f).With().Timestamp().Logger().Level(zerolog.InfoLevel)
	return &linkServer{
		server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), logger),
		log:    f,
		links:  map[string]*Link{},
	}, nil
}

// add starts a link named name with one proxy per upstream address, each
// listening on the loopback address of the same index in listen
// ("127.0.0.1:0" picks a free port).
func (s *linkServer) add(name string, listen, upstreams []string) (*Link, error) {
	if _, ok := s.links[name]; ok {
		return nil, fmt.Errorf("clusterset: link %s exists", name)
	}
	l := &Link{Name: name}
	for i, up := range upstreams {
		if err := requireLoopback(listen[i]); err != nil {
			return nil, err
		}
		if err := requireLoopback(up); err != nil {
			return nil, err
		}
		p := toxiproxy.NewProxy(s.server, fmt.Sprintf("%s#%d", name, i), listen[i], up)
		if err := p.Start(); err != nil {
			l.stop()
			return nil, fmt.Errorf("clusterset: link %s on %s: %w", name, listen[i], err)
		}
		l.proxies = append(l.proxies, p)
	}
	s.links[name] = l
	return l, nil
}

func (s *linkServer) close() {
	for _, l := range s.links {
		l.stop()
	}
	_ = s.log.Close()
}

// requireLoopback refuses a link address outside 127.0.0.0/8 and ::1.
func requireLoopback(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("clusterset: link address %q: %w", hostport, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("clusterset: link address %q is not a loopback address", hostport)
	}
	return nil
}

// Addr is where the link's first (often only) proxy listens, ip:port.
func (l *Link) Addr() string { return l.Addrs()[0] }

// Addrs are where the link's proxies listen, one per port it carries.
func (l *Link) Addrs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	addrs := make([]string, 0, len(l.proxies))
	for _, p := range l.proxies {
		addrs = append(addrs, p.Listen)
	}
	return addrs
}

// Cut takes the link down as a refused route does: open connections close
// and new ones are refused, until Heal.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies {
		p.Stop()
	}
	l.cut = true
}

// Blackhole makes the link accept connections and then carry nothing in
// either direction, on open connections and new ones: no RST, no FIN, no
// answer, as a dropped route or a hung middlebox. Heal closes the
// connections that were blackholed (toxiproxy ends them when the toxic
// goes) and lets new ones through.
func (l *Link) Blackhole() error {
	return l.addBoth("timeout", map[string]any{"timeout": 0})
}

// Latency delays everything the far end sends back by latency ± jitter,
// so that each request-answer exchange over the link takes that much
// longer (a watch event arrives that much later).
func (l *Link) Latency(latency, jitter time.Duration) error {
	return l.add("latency", "downstream", map[string]any{"latency": latency.Milliseconds(), "jitter": jitter.Milliseconds()})
}

// Bandwidth limits each connection of the link to kbPerSecond kilobytes a
// second in each direction.
func (l *Link) Bandwidth(kbPerSecond int64) error {
	return l.addBoth("bandwidth", map[string]any{"rate": kbPerSecond})
}

// ResetPeer resets (TCP RST) each connection after when it next carries
// data, new connections included: a stream torn down mid-way.
func (l *Link) ResetPeer(after time.Duration) error {
	return l.add("reset_peer", "upstream", map[string]any{"timeout": after.Milliseconds()})
}

// LimitData closes each connection once the far end has sent n bytes
// over it: an answer cut off mid-stream.
func (l *Link) LimitData(n int64) error {
	return l.add("limit_data", "downstream", map[string]any{"bytes": n})
}

// Slice splits what the far end sends into pieces of about averageSize
// bytes (± variation), delay apart, as a congested path delivers them.
func (l *Link) Slice(averageSize, variation int, delay time.Duration) error {
	return l.add("slicer", "downstream", map[string]any{"average_size": averageSize, "size_variation": variation, "delay": delay.Microseconds()})
}

// Heal removes every fault: the link listens again if it was cut, and
// carries data as is.
func (l *Link) Heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, p := range l.proxies {
		p.Toxics.ResetToxics(context.Background())
		if l.cut {
			if err := p.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
				errs = append(errs, fmt.Errorf("clusterset: link %s listening again on %s: %w", l.Name, p.Listen, err))
			}
		}
	}
	l.cut = false
	return errors.Join(errs...)
}

// Faults describes the faults the link has now ("cut", toxic names), for
// test logs.
func (l *Link) Faults() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	if l.cut {
		out = append(out, "cut")
	}
	if len(l.proxies) > 0 {
		for _, t := range l.proxies[0].Toxics.GetToxicArray() {
			b, _ := json.Marshal(t)
			out = append(out, string(b))
		}
	}
	return out
}

func (l *Link) addBoth(kind string, attrs map[string]any) error {
	if err := l.add(kind, "upstream", attrs); err != nil {
		return err
	}
	return l.add(kind, "downstream", attrs)
}

// add adds toxic kind to every proxy of the link, on stream "upstream"
// (towards the far end) or "downstream" (back to the client). A fault
// already on the link is replaced.
func (l *Link) add(kind, stream string, attrs map[string]any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := kind + "_" + stream
	body, err := json.Marshal(map[string]any{"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	for _, p := range l.proxies {
		if p.Toxics.GetToxic(name) != nil {
			if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
				return fmt.Errorf("clusterset: link %s: replacing %s: %w", l.Name, name, err)
			}
		}
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
			return fmt.Errorf("clusterset: link %s: adding %s: %w", l.Name, name, err)
		}
	}
	return nil
}

func (l *Link) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies {
		p.Stop()
	}
}

// linkMembersDir holds, per cluster, the member kubeconfigs of its
// mci-apiservers that point at its member links.
const linkMembersDir = "members-via-links"

// readerMembersDir holds, per cluster, the member kubeconfigs of its
// mci-apiservers when each reads with an identity of its own
// (Options.SummaryReaderOnly) and there are no links.
const readerMembersDir = "members-by-reader"

func memberLinkName(watcher, member string) string { return watcher + "->" + member }
func clientLinkName(cluster string) string         { return "client->" + cluster }
func eppLinkName(cluster string) string            { return "sidecar->" + cluster + "-epp" }

// MemberLink is the link from every mci-apiserver replica of watcher to
// member's kube-apiserver (Options.Links).
func (cs *ClusterSet) MemberLink(watcher, member string) (*Link, error) {
	return cs.link(memberLinkName(watcher, member))
}

// ClientLink is the link from a test client to cluster's kube-apiserver
// (Options.Links); ClientConfig returns a configuration that uses it.
func (cs *ClusterSet) ClientLink(cluster string) (*Link, error) {
	return cs.link(clientLinkName(cluster))
}

// EPPLink is the link from mci-sidecar to the EPP of an exporting cluster
// of the data path (Options.Links and StartDataPath).
func (cs *ClusterSet) EPPLink(cluster string) (*Link, error) {
	return cs.link(eppLinkName(cluster))
}

// Links lists every link's name.
func (cs *ClusterSet) Links() []string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.links == nil {
		return nil
	}
	names := make([]string, 0, len(cs.links.links))
	for n := range cs.links.links {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// HealLinks removes every fault from every link.
func (cs *ClusterSet) HealLinks() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.links == nil {
		return nil
	}
	var errs []error
	for _, l := range cs.links.links {
		errs = append(errs, l.Heal())
	}
	return errors.Join(errs...)
}

func (cs *ClusterSet) link(name string) (*Link, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.links == nil {
		return nil, errors.New("clusterset: this ClusterSet has no links (Options.Links)")
	}
	l, ok := cs.links.links[name]
	if !ok {
		return nil, fmt.Errorf("clusterset: no link %s", name)
	}
	return l, nil
}

// ClientConfig returns an admin client configuration for cluster that goes
// through ClientLink(cluster). The kube-apiserver's certificate is valid
// for 127.0.0.1 whatever the port, so TLS is verified as usual.
func (cs *ClusterSet) ClientConfig(cluster string) (*rest.Config, error) {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return nil, err
	}
	l, err := cs.ClientLink(cluster)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.Host = "https://" + l.Addr()
	return cfg, nil
}

// MemberServer is the URL at which watcher's mci-apiservers reach member's
// kube-apiserver: through MemberLink(watcher, member) with Options.Links,
// else directly. A member Secret written for watcher should name it.
func (cs *ClusterSet) MemberServer(watcher, member string) (string, error) {
	c, err := cs.Cluster(member)
	if err != nil {
		return "", err
	}
	if cs.links == nil {
		return c.Server, nil
	}
	l, err := cs.MemberLink(watcher, member)
	if err != nil {
		return "", err
	}
	return "https://" + l.Addr(), nil
}

// MemberKubeconfigDir is the --member-kubeconfig-dir of cluster's
// mci-apiservers: with Options.Links a directory per cluster whose
// kubeconfigs point at its member links, else its own directory when
// each reader has an identity of its own, else the shared MembersDir.
func (cs *ClusterSet) MemberKubeconfigDir(cluster string) string {
	if cs.links == nil {
		// A ClusterSet Load attaches to knows its readers' own identities
		// by the directory they are written in.
		own := filepath.Join(cs.Dir, readerMembersDir, cluster)
		if _, err := os.Stat(own); err == nil {
			return own
		}
		return cs.MembersDir()
	}
	return filepath.Join(cs.Dir, linkMembersDir, cluster)
}

// startLinks starts the member and client links of every cluster.
func (cs *ClusterSet) startLinks() error {
	s, err := newLinkServer(filepath.Join(cs.Dir, "logs", "links.log"))
	if err != nil {
		return err
	}
	cs.links = s
	for _, c := range cs.Clusters {
		up := strings.TrimPrefix(c.Server, "https://")
		if _, err := s.add(clientLinkName(c.Name), []string{"127.0.0.1:0"}, []string{up}); err != nil {
			return err
		}
		for _, w := range cs.Clusters {
			if w == c {
				continue
			}
			l, err := s.add(memberLinkName(w.Name, c.Name), []string{"127.0.0.1:0"}, []string{up})
			if err != nil {
				return err
			}
			cs.progress("link %s on %s", l.Name, l.Addr())
		}
	}
	return nil
}

// startEPPLink puts a link from serviceIP, the address the sidecar dials
// (the EPP Service's), to eppIP, where the EPP listens, on every port. It
// replaces the link of a previous data path.
func (cs *ClusterSet) startEPPLink(cluster, serviceIP, eppIP string, ports ...int) error {
	if cs.links == nil {
		return nil
	}
	var listen, up []string
	for _, p := range ports {
		listen = append(listen, net.JoinHostPort(serviceIP, strconv.Itoa(p)))
		up = append(up, net.JoinHostPort(eppIP, strconv.Itoa(p)))
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if old, ok := cs.links.links[eppLinkName(cluster)]; ok {
		old.stop()
		delete(cs.links.links, eppLinkName(cluster))
	}
	l, err := cs.links.add(eppLinkName(cluster), listen, up)
	if err != nil {
		return err
	}
	cs.progress("link %s on %s", l.Name, strings.Join(l.Addrs(), ", "))
	return nil
}
