package clusterset

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/recompute"
)

const (
	// MemberClusterLabel marks a Secret that holds a member's kubeconfig;
	// its value is the member's cluster name.
	MemberClusterLabel = "mci.x-k8s.io/member-cluster"
	// MemberKubeconfigKey is the Secret key that holds the kubeconfig.
	MemberKubeconfigKey = "kubeconfig"
)

// MemberConfig is one member as a membership source describes it.
type MemberConfig struct {
	rest        *rest.Config
	fingerprint string
	// created is when the Secret or ClusterProfile that names the member
	// was created; zero for a kubeconfig file. Of two members of one
	// cluster, the one created first keeps it (identity.go).
	created time.Time
	// err says why the source's kubeconfig for this member is unusable.
	err error
	// labels are the labels of the Secret or ClusterProfile that names
	// the member (none for a kubeconfig file): an export's scope selects
	// members by them (pkg/imports).
	labels map[string]string
	// drain is the value of the same object's drain annotation
	// (v1alpha1.DrainAnnotation), "" when it has none: the member asks
	// importers to drain every export of its cluster (memberdrain.go).
	drain string
	// credentialless fingerprints the kubeconfig without the values of
	// its inline credentials and CA bundles ("" when client-go reads any
	// of them from a file or a plugin): a member whose kubeconfig changes
	// in them alone is rotated in place (Cache.rotateInPlace).
	credentialless string
}

// ParseMemberKubeconfig turns kubeconfig bytes into a member connection.
// A bad kubeconfig is reported, never fatal.
func ParseMemberKubeconfig(data []byte) MemberConfig {
	mc := MemberConfig{fingerprint: fingerprintOf(data)}
	if len(data) == 0 {
		mc.err = fmt.Errorf("kubeconfig is empty")
		return mc
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		mc.err = fmt.Errorf("invalid kubeconfig: %w", err)
		return mc
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		mc.err = fmt.Errorf("invalid kubeconfig: %w", err)
		return mc
	}
	mc.rest = rc
	mc.credentialless = credentiallessFingerprint(cfg, rc)
	return mc
}

// credentiallessFingerprint fingerprints a kubeconfig with the values of
// its users' inline bearer tokens, client certificates and keys and of its
// clusters' inline CA bundles replaced by a mark, so that two kubeconfigs
// that differ in nothing else have the same: which of them are set still
// counts (a token that becomes a certificate is another way to
// authenticate, a CA bundle that appears replaces the system's). "" when
// the resolved configuration reads a credential or CA from a file or a
// plugin (client-go follows those on its own, or not at all) or skips
// verification.
func credentiallessFingerprint(cfg *clientcmdapi.Config, rc *rest.Config) string {
	if rc.BearerTokenFile != "" || rc.ExecProvider != nil || rc.AuthProvider != nil || rc.Insecure ||
		rc.CAFile != "" || rc.CertFile != "" || rc.KeyFile != "" {
		return ""
	}
	mark := func(b []byte) []byte {
		if len(b) == 0 {
			return nil
		}
		return []byte("inline")
	}
	blank := cfg.DeepCopy()
	for _, u := range blank.AuthInfos {
		if u == nil {
			continue
		}
		if u.Token != "" {
			u.Token = "inline"
		}
		u.ClientCertificateData, u.ClientKeyData = mark(u.ClientCertificateData), mark(u.ClientKeyData)
	}
	for _, c := range blank.Clusters {
		if c != nil {
			c.CertificateAuthorityData = mark(c.CertificateAuthorityData)
		}
	}
	data, err := clientcmd.Write(*blank)
	if err != nil {
		return ""
	}
	return fingerprintOf(data)
}

// A Source reports the members it knows of, as a complete set, every time
// that set may have changed.
type Source interface {
	Name() string
	Run(ctx context.Context, report func(source string, members map[string]MemberConfig))
}

// DirSource reads one kubeconfig file per member from a directory; the file
// name (without a .kubeconfig, .yaml or .yml extension) is the cluster name.
// The directory is read again every Interval, so mounted Secrets that
// change on disk are followed.
type DirSource struct {
	Dir      string
	Interval time.Duration
}

// Name identifies the source in logs and conflicts.
func (s DirSource) Name() string { return "dir:" + s.Dir }

// Run reports the directory's members until ctx ends.
func (s DirSource) Run(ctx context.Context, report func(string, map[string]MemberConfig)) {
	interval := s.Interval
	if interval == 0 {
		interval = 10 * time.Second
	}
	var last map[string]MemberConfig
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		members, err := readMemberDir(s.Dir, last)
		if err != nil {
			// An unreadable directory keeps the members we have.
			klog.FromContext(ctx).Error(err, "Reading member kubeconfig directory", "dir", s.Dir)
			return
		}
		last = members
		report(s.Name(), members)
	}, interval)
}

// readMemberDir reads the members of dir. A file whose bytes are those
// last read for its member (last, from the read before) keeps that read's
// parse: a thousand kubeconfigs parsed every interval cost an importer a
// few percent of a core for nothing.
func readMemberDir(dir string, last map[string]MemberConfig) (map[string]MemberConfig, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	members := map[string]MemberConfig{}
	for _, e := range entries {
		// Skip hidden entries: Kubernetes Secret volumes keep their data in
		// ..data and ..<timestamp> folders behind symlinks.
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if info, err := os.Stat(path); err != nil || info.IsDir() {
			continue
		}
		name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".kubeconfig"), ".yaml"), ".yml")
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			klog.ErrorS(fmt.Errorf("%s", strings.Join(errs, "; ")), "Ignoring member kubeconfig file with an invalid cluster name", "file", path, "cluster", name)
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			members[name] = MemberConfig{err: err}
			continue
		}
		if was, ok := last[name]; ok && was.fingerprint == fingerprintOf(data) {
			members[name] = was
			continue
		}
		members[name] = ParseMemberKubeconfig(data)
	}
	return members, nil
}

// SecretSource follows Secrets labelled MemberClusterLabel in one namespace
// of the local cluster.
type SecretSource struct {
	Client    kubernetes.Interface
	Namespace string
}

// Name identifies the source in logs and conflicts.
func (s SecretSource) Name() string { return "secrets:" + s.Namespace }

// Run reports the Secrets' members until ctx ends.
func (s SecretSource) Run(ctx context.Context, report func(string, map[string]MemberConfig)) {
	factory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = MemberClusterLabel }))
	informer := factory.Core().V1().Secrets()
	lister := informer.Lister()
	loop := recompute.New("member_secrets")
	_, _ = informer.Informer().AddEventHandler(loop.Handler())
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return
	}
	loop.Run(ctx, func(context.Context) error {
		secrets, err := lister.List(labels.Everything())
		if err != nil {
			return err
		}
		report(s.Name(), membersFromSecrets(secrets))
		return nil
	})
}

func membersFromSecrets(secrets []*corev1.Secret) map[string]MemberConfig {
	members := map[string]MemberConfig{}
	sort.Slice(secrets, func(i, j int) bool { return secrets[i].Name < secrets[j].Name })
	for _, s := range secrets {
		name := s.Labels[MemberClusterLabel]
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			klog.ErrorS(fmt.Errorf("%s", strings.Join(errs, "; ")), "Ignoring member Secret with an invalid cluster name", "secret", klog.KObj(s), "cluster", name)
			continue
		}
		if prev, dup := members[name]; dup && prev.err == nil {
			klog.ErrorS(nil, "Ignoring member Secret: another Secret already names this cluster", "secret", klog.KObj(s), "cluster", name)
			continue
		}
		data, ok := s.Data[MemberKubeconfigKey]
		if !ok {
			members[name] = MemberConfig{err: fmt.Errorf("secret %s/%s has no %q key", s.Namespace, s.Name, MemberKubeconfigKey)}
			continue
		}
		mc := parseSecretKubeconfig(data)
		mc.created = s.CreationTimestamp.Time
		mc.labels = maps.Clone(s.Labels)
		mc.drain = s.Annotations[v1alpha1.DrainAnnotation]
		members[name] = mc
	}
	return members
}

// parseSecretKubeconfig is ParseMemberKubeconfig for a kubeconfig from a
// Secret, which must be self-contained: whoever may write a Secret in the
// server's namespace must not be able to make the server run a command,
// read one of its own files (its ServiceAccount token, say) and send it to
// a server of their choosing, or talk to a member without verified TLS.
// Kubeconfig files of the member directory are the operator's and may
// reference what is mounted beside them.
//
// Two checks, in this order. Every cluster and user entry is checked before
// client-go resolves anything, whatever its name and whether a context
// names it: resolving already reads a tokenFile and looks for the files
// the entries name, and which entries client-go picks (the current
// context's, or those named "" when there is none) is its business, not
// ours to guess. Then the configuration client-go resolved, the one the
// connection is made with, is checked again: it decides.
func parseSecretKubeconfig(data []byte) MemberConfig {
	mc := MemberConfig{fingerprint: fingerprintOf(data)}
	if len(data) == 0 {
		mc.err = fmt.Errorf("kubeconfig is empty")
		return mc
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		mc.err = fmt.Errorf("invalid kubeconfig: %w", err)
		return mc
	}
	if err := selfContained(cfg); err != nil {
		mc.err = err
		return mc
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		mc.err = fmt.Errorf("invalid kubeconfig: %w", err)
		return mc
	}
	if problems := resolvedProblems(rc, nil); len(problems) > 0 {
		mc.err = fmt.Errorf("a kubeconfig from a Secret must be self-contained: %s", strings.Join(problems, "; "))
		return mc
	}
	mc.rest = rc
	mc.credentialless = credentiallessFingerprint(cfg, rc)
	return mc
}

// selfContained says what in any cluster or user entry of cfg is not
// inline or would weaken TLS: entry and field names only, never values,
// which may be secret.
func selfContained(cfg *clientcmdapi.Config) error {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(cfg.Clusters)) {
		c := cfg.Clusters[name]
		if c == nil {
			continue
		}
		if c.CertificateAuthority != "" {
			problems = append(problems, fmt.Sprintf("cluster %q: certificate-authority names a file (inline it as certificate-authority-data)", name))
		}
		if c.InsecureSkipTLSVerify {
			problems = append(problems, fmt.Sprintf("cluster %q: insecure-skip-tls-verify would send the credentials to whoever answers (give certificate-authority-data)", name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		u := cfg.AuthInfos[name]
		if u == nil {
			continue
		}
		if u.Exec != nil {
			problems = append(problems, fmt.Sprintf("user %q: exec runs a command", name))
		}
		if u.AuthProvider != nil {
			problems = append(problems, fmt.Sprintf("user %q: auth-provider runs a plugin", name))
		}
		if u.TokenFile != "" {
			problems = append(problems, fmt.Sprintf("user %q: tokenFile names a file (inline it as token)", name))
		}
		if u.ClientCertificate != "" || u.ClientKey != "" {
			problems = append(problems, fmt.Sprintf("user %q: client-certificate or client-key names a file (inline them as client-certificate-data and client-key-data)", name))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("a kubeconfig from a Secret must be self-contained: %s", strings.Join(problems, "; "))
}

// resolvedProblems says what in a resolved client configuration would make
// the server run a command, read one of its own files, or send requests
// (and credentials) without verified TLS. exec vets an exec plugin: nil
// refuses any.
//
// A proxy-url is no problem: it reads nothing local, and with TLS required
// the connection to the member is tunnelled through it (HTTP CONNECT or
// SOCKS5), verified end to end, so the proxy sees neither credentials nor
// data, and it reaches no address the kubeconfig's writer could not name
// as the server anyway.
func resolvedProblems(rc *rest.Config, exec func(*clientcmdapi.ExecConfig) error) []string {
	var problems []string
	switch {
	case rc.ExecProvider != nil && exec == nil:
		problems = append(problems, "the resolved user runs an exec plugin")
	case rc.ExecProvider != nil:
		if err := exec(rc.ExecProvider); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if rc.AuthProvider != nil {
		problems = append(problems, "the resolved user runs an auth-provider plugin")
	}
	if rc.BearerTokenFile != "" {
		problems = append(problems, "the resolved user reads its token from a file")
	}
	if rc.CAFile != "" {
		problems = append(problems, "the resolved cluster reads its CA from a file")
	}
	if rc.CertFile != "" || rc.KeyFile != "" {
		problems = append(problems, "the resolved user reads its client certificate or key from a file")
	}
	if rc.Insecure {
		problems = append(problems, "the resolved cluster skips TLS verification")
	}
	// As client-go decides whether it speaks TLS (rest.IsConfigTransportTLS).
	switch u, _, err := rest.DefaultServerUrlFor(rc); {
	case err != nil:
		problems = append(problems, "the resolved server is not a URL")
	case u.Scheme != "https":
		problems = append(problems, "the resolved server is not reached over TLS (an https:// server)")
	}
	return problems
}

// desiredMembers merges what every source reports. A cluster named by two
// sources is taken from the one that reported it first; the local cluster
// is never taken from a source, it is always the server's own connection.
type desiredMembers struct {
	local   string
	order   []string
	sources map[string]map[string]MemberConfig
	chosen  map[string]chosenMember
	// rejected remembers bad kubeconfigs already reported, so a directory
	// re-read does not report the same one every interval.
	rejected map[string]chosenMember
	// localClaims remembers, per source, the fingerprint of the kubeconfig
	// it names the local cluster with, so that each is reported once.
	localClaims map[string]string
}

type chosenMember struct {
	source      string
	fingerprint string
}

// change is one member to (re)connect, to leave alone because its new
// kubeconfig is bad (err), or to remove (config nil).
type change struct {
	name   string
	source string
	config *MemberConfig
	err    error
}

func newDesiredMembers(local string) *desiredMembers {
	return &desiredMembers{local: local, sources: map[string]map[string]MemberConfig{}, chosen: map[string]chosenMember{}, rejected: map[string]chosenMember{}, localClaims: map[string]string{}}
}

func (d *desiredMembers) update(source string, members map[string]MemberConfig) []change {
	if _, known := d.sources[source]; !known {
		d.order = append(d.order, source)
	}
	d.sources[source] = members
	if d.newLocalClaim(source, members) {
		klog.InfoS("Ignoring a member kubeconfig that names the local cluster: its own connection (--kubeconfig) is used", "cluster", d.local, "source", source)
	}

	want := map[string]chosenMember{}
	configs := map[string]MemberConfig{}
	for _, src := range d.order {
		for name, mc := range d.sources[src] {
			if name == d.local {
				continue
			}
			if cur, ok := want[name]; ok {
				if cur.source != src {
					klog.ErrorS(nil, "Cluster named by two membership sources; using the first", "cluster", name, "using", cur.source, "ignoring", src)
				}
				continue
			}
			want[name] = chosenMember{source: src, fingerprint: mc.fingerprint}
			configs[name] = mc
		}
	}
	var changes []change
	for name, c := range want {
		if d.chosen[name] == c || d.rejected[name] == c {
			continue
		}
		mc := configs[name]
		changes = append(changes, change{name: name, source: c.source, config: &mc, err: mc.err})
		if mc.err != nil {
			kind, _, _ := strings.Cut(c.source, ":")
			memberConfigRejected.WithLabelValues(kind).Inc()
			d.rejected[name] = c
			continue
		}
		d.chosen[name] = c
		delete(d.rejected, name)
	}
	for name := range d.rejected {
		if _, ok := want[name]; !ok {
			delete(d.rejected, name)
		}
	}
	for name := range d.chosen {
		if _, ok := want[name]; !ok {
			changes = append(changes, change{name: name})
			delete(d.chosen, name)
		}
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].name < changes[j].name })
	return changes
}

// metas are what the members' Secrets or ClusterProfiles say of them
// beside their connections, the local cluster's included when a source
// names it (a ClusterSet-wide member list does), each from the first
// source that names the cluster, as its connection is.
func (d *desiredMembers) metas() map[string]memberMeta {
	out := map[string]memberMeta{}
	for _, src := range d.order {
		for name, mc := range d.sources[src] {
			if _, ok := out[name]; !ok && mc.err == nil {
				out[name] = memberMeta{labels: mc.labels, drain: mc.drain}
			}
		}
	}
	return out
}

// newLocalClaim says whether source names the local cluster with a
// kubeconfig not reported yet. Such a kubeconfig is ignored, as the
// server's own connection is the local cluster: a ClusterSet-wide member
// list names every cluster, this one included, so it is no error, but
// whoever expects it to be used can read why it is not, once.
func (d *desiredMembers) newLocalClaim(source string, members map[string]MemberConfig) bool {
	mc, ok := members[d.local]
	if !ok {
		delete(d.localClaims, source)
		return false
	}
	if seen, ok := d.localClaims[source]; ok && seen == mc.fingerprint {
		return false
	}
	d.localClaims[source] = mc.fingerprint
	return true
}
