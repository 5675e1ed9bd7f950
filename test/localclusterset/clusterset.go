// Package localclusterset runs a real local ClusterSet for end-to-end tests and
// `make run`: one etcd, one kube-apiserver per member cluster (each under
// its own etcd prefix) and one kube-controller-manager per member cluster
// (namespace deletion, garbage collection, service accounts) on loopback
// ports, the member-cluster CRDs, and optionally one mci-apiserver per
// cluster registered with that cluster's aggregator through an APIService.
//
// No kubelet runs, and no controller that needs one: tests play their part
// by writing status themselves (Apply writes the status a manifest
// carries) and write EndpointSlices themselves. Everything listens on
// 127.0.0.1 only. hack/build-kube-tools.sh builds the binaries.
package localclusterset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultClusters are the member clusters of a ClusterSet when Options
// names none.
var DefaultClusters = []string{"cluster-a", "cluster-b", "cluster-c"}

// Cluster is one member cluster of a running ClusterSet.
type Cluster struct {
	Name string
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	// Server is the kube-apiserver URL, https://127.0.0.1:<port>.
	Server string
	// Config is an admin client configuration; copy it (rest.CopyConfig)
	// before changing it.
	Config *rest.Config
	// MCIAPIServerPort is the port the APIService points at, 0 when no
	// mci-apiserver runs: that of the front that plays the Service before
	// the replicas, or of the one replica of a Detached ClusterSet.
	MCIAPIServerPort int
	// MCIAPIServerReplicaPorts are the ports of the mci-apiserver replicas,
	// in replica order.
	MCIAPIServerReplicaPorts []int

	apiServer         *process
	controllerManager *process
	mciAPIServer      *process // replica 0
	// mciReplicas are replicas 1 and up, with Options.Replicas > 1.
	mciReplicas []*process
	front       *replicaFront
	// mciExtraArgs is how many flags RestartMCIAPIServerWithArgs added
	// after the harness's own.
	mciExtraArgs int
}

// ClusterSet is a running local ClusterSet.
type ClusterSet struct {
	// Dir is the absolute path of Options.Dir.
	Dir string
	// Clusters are the member clusters, in the order of Options.Clusters.
	Clusters []*Cluster

	mu                sync.Mutex
	detached          bool
	binDir            string
	mciBinary         string
	mciModTime        time.Time
	replicas          int
	serverFlags       mciServerFlags
	summaryReaderOnly bool
	readerIdentities  bool
	memberLabels      map[string]map[string]string
	etcd              *process
	pki               *pki
	log               io.Writer
	started           time.Time

	// links are the link proxies of Options.Links (links.go); nil without.
	links *linkServer

	// dataPath are the servers of StartDataPath (datapath.go).
	dataPath []*process
}

// Up starts a ClusterSet and returns when every server is ready: CRDs
// Established and, with an mci-apiserver, its APIService Available. On
// failure it stops whatever it started and says which server failed, with
// the end of its log.
func Up(ctx context.Context, opts Options) (*ClusterSet, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	unlock, err := lockDir(opts.Dir, opts.Log)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if cs, err := reuse(ctx, opts); cs != nil || err != nil {
		return cs, err
	}
	cs := &ClusterSet{
		Dir:       opts.Dir,
		detached:  opts.Detached,
		binDir:    opts.BinDir,
		mciBinary: opts.MCIAPIServerBinary,
		log:       opts.Log,
		started:   time.Now(),

		replicas: opts.Replicas,
		serverFlags: mciServerFlags{
			unreachableAfter: opts.MemberUnreachableAfter,
			removeAfter:      opts.MemberRemoveAfter,
			memberSummaries:  opts.MemberSummaries,
			summariesOf:      opts.MemberSummariesOf,
			watchHistorySize: opts.WatchHistorySize,
		},
		summaryReaderOnly: opts.SummaryReaderOnly,
		readerIdentities:  opts.ReaderIdentities,
		memberLabels:      opts.MemberLabels,
	}
	if err := cs.up(ctx, opts); err != nil {
		if stopErr := cs.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, err
	}
	return cs, nil
}

func (cs *ClusterSet) up(ctx context.Context, opts Options) error {
	crds, err := readCRDs(opts.CRDPaths)
	if err != nil {
		return err
	}
	for _, name := range markUnapproved(crds) {
		cs.progress("WARNING: CRD %s has no %s annotation, which a real cluster requires of its group: installing it marked unapproved", name, apiApprovalAnnotation)
	}
	if err := prepareDir(cs.Dir); err != nil {
		return err
	}
	if cs.pki, err = newPKI(filepath.Join(cs.Dir, "pki"), opts.Clusters); err != nil {
		return err
	}
	if cs.mciBinary != "" {
		if cs.mciModTime, err = modTime(cs.mciBinary); err != nil {
			return err
		}
	}
	// etcd client and peer ports, a kube-apiserver port per cluster, per
	// cluster a port for each mci-apiserver replica and, unless detached,
	// a port for the front before them, and a kube-controller-manager
	// port per cluster, last.
	perCluster := cs.replicas
	if !cs.detached {
		perCluster++
	}
	ports, err := FreePorts(2 + len(opts.Clusters) + perCluster*len(opts.Clusters) + len(opts.Clusters))
	if err != nil {
		return err
	}
	controllerManagerPorts := ports[len(ports)-len(opts.Clusters):]

	cs.etcd = etcdProcess(cs.Dir, cs.binDir, ports[0], ports[1])
	cs.progress("starting etcd on %s (data in %s)", hostPort(ports[0]), filepath.Join(cs.Dir, "etcd"))
	if err := cs.etcd.start(cs.detached); err != nil {
		return err
	}
	// Recorded as soon as they run, so that the next `up` or `down` finds
	// detached servers even if this process is killed half-way.
	if err := cs.saveState(); err != nil {
		return err
	}
	if err := waitReady(ctx, cs.etcd, etcdReadyTimeout, etcdHealthy(ports[0])); err != nil {
		return err
	}

	// Start every kube-apiserver before waiting for any: they take a while
	// to come up and do so in parallel.
	for i, name := range opts.Clusters {
		c, err := cs.newCluster(name, ports[2+i])
		if err != nil {
			return err
		}
		cs.Clusters = append(cs.Clusters, c)
		cs.progress("starting %s kube-apiserver on %s", name, hostPort(ports[2+i]))
		if err := c.apiServer.start(cs.detached); err != nil {
			return err
		}
		if err := cs.saveState(); err != nil {
			return err
		}
	}
	for _, c := range cs.Clusters {
		cs.progress("waiting for %s kube-apiserver to be ready", c.Name)
		if err := waitReady(ctx, c.apiServer, apiServerReadyTimeout, apiServerReady(c.Config)); err != nil {
			return err
		}
	}
	// Started before the CRDs go in, awaited after: it comes up meanwhile.
	for i, c := range cs.Clusters {
		if err := cs.startControllerManager(c, controllerManagerPorts[i]); err != nil {
			return err
		}
	}

	cs.progress("installing CRDs (%d) and member-reader RBAC in every cluster", len(crds))
	if err := cs.eachCluster(func(c *Cluster) error { return cs.installBasics(ctx, c, crds) }); err != nil {
		return err
	}
	for _, c := range cs.Clusters {
		if err := cs.waitControllerManager(ctx, c); err != nil {
			return err
		}
	}
	if opts.Links {
		if err := cs.startLinks(); err != nil {
			return err
		}
	}
	if err := cs.writeMembers(); err != nil {
		return err
	}
	if err := cs.writeMemberSecrets(ctx); err != nil {
		return err
	}

	if cs.mciBinary != "" {
		for i, c := range cs.Clusters {
			own := ports[2+len(cs.Clusters)+i*perCluster:][:perCluster]
			for r := range cs.replicas {
				p := mciAPIServerProcess(cs.Dir, cs.mciBinary, c.Name, cs.MemberKubeconfigDir(c.Name), r, own[r], cs.serverFlags)
				if r == 0 {
					c.mciAPIServer = p
				} else {
					c.mciReplicas = append(c.mciReplicas, p)
				}
				c.MCIAPIServerReplicaPorts = append(c.MCIAPIServerReplicaPorts, p.Port)
			}
			c.MCIAPIServerPort = c.mciAPIServer.Port
			if !cs.detached {
				c.MCIAPIServerPort = own[cs.replicas]
			}
			if err := cs.startMCIAPIServer(ctx, c); err != nil {
				return err
			}
			if err := cs.saveState(); err != nil {
				return err
			}
		}
		for _, c := range cs.Clusters {
			if err := cs.waitMCIAPIServer(ctx, c); err != nil {
				return err
			}
		}
	}
	cs.progress("ClusterSet up: %s", strings.Join(cs.Names(), ", "))
	return nil
}

// prepareDir clears what a previous ClusterSet left in dir: only the
// entries this package writes, never the directory itself, which a user may
// have pointed anywhere. The previous logs are kept aside for inspection.
func prepareDir(dir string) error {
	for _, sub := range []string{"etcd", "pki", "members", linkMembersDir, readerMembersDir, stateFile, "logs.previous"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return fmt.Errorf("clearing %s: %w", dir, err)
		}
	}
	if err := os.Rename(filepath.Join(dir, "logs"), filepath.Join(dir, "logs.previous")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("keeping previous logs: %w", err)
	}
	for _, sub := range []string{"logs", "members"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	return nil
}

func (cs *ClusterSet) newCluster(name string, port int) (*Cluster, error) {
	c := &Cluster{
		Name:       name,
		Kubeconfig: filepath.Join(cs.Dir, name+".kubeconfig"),
		Server:     "https://" + hostPort(port),
		apiServer:  apiServerProcess(cs.Dir, cs.binDir, name, cs.etcd.Port, port),
	}
	cfg := kubeconfig(name, c.Server, cs.pki.servingCA.certPEM, "admin", cs.pki.admin)
	if err := writeKubeconfig(c.Kubeconfig, cfg); err != nil {
		return nil, err
	}
	var err error
	if c.Config, err = restConfig(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// installBasics installs the CRDs and the permissions of the members/
// identity in one cluster.
func (cs *ClusterSet) installBasics(ctx context.Context, c *Cluster, crds []*unstructured.Unstructured) error {
	kube, dyn, err := clients(c.Config)
	if err != nil {
		return err
	}
	if err := installCRDs(ctx, dyn, crds); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	if err := grantMemberReader(ctx, kube, cs.summaryReaderOnly); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return nil
}

// writeMembers writes the kubeconfig of every cluster for the read-only
// member identity. Every mci-apiserver gets the whole directory and skips
// its own cluster, as with a real ClusterSet's member list. With links,
// each cluster's mci-apiservers get a directory of their own whose
// kubeconfigs point at their member links.
func (cs *ClusterSet) writeMembers() error {
	for _, c := range cs.Clusters {
		cfg := kubeconfig(c.Name, c.Server, cs.pki.servingCA.certPEM, memberReaderUser, cs.pki.memberReader)
		if err := writeKubeconfig(filepath.Join(cs.MembersDir(), c.Name+".kubeconfig"), cfg); err != nil {
			return err
		}
	}
	if cs.links == nil && cs.readerIdentities {
		for _, w := range cs.Clusters {
			for _, c := range cs.Clusters {
				cfg := kubeconfig(c.Name, c.Server, cs.pki.servingCA.certPEM, memberReaderUser, cs.pki.memberReaders[w.Name])
				if err := writeKubeconfig(filepath.Join(cs.Dir, readerMembersDir, w.Name, c.Name+".kubeconfig"), cfg); err != nil {
					return err
				}
			}
		}
	}
	if cs.links == nil {
		return nil
	}
	for _, w := range cs.Clusters {
		for _, c := range cs.Clusters {
			server := c.Server
			if c != w {
				var err error
				if server, err = cs.MemberServer(w.Name, c.Name); err != nil {
					return err
				}
			}
			reader := cs.pki.memberReader
			if cs.readerIdentities {
				reader = cs.pki.memberReaders[w.Name]
			}
			cfg := kubeconfig(c.Name, server, cs.pki.servingCA.certPEM, memberReaderUser, reader)
			if err := writeKubeconfig(filepath.Join(cs.MemberKubeconfigDir(w.Name), c.Name+".kubeconfig"), cfg); err != nil {
				return err
			}
		}
	}
	return nil
}

// Cluster returns the member cluster called name.
func (cs *ClusterSet) Cluster(name string) (*Cluster, error) {
	for _, c := range cs.Clusters {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("clusterset: no cluster %q (have %s)", name, strings.Join(cs.Names(), ", "))
}

// Names returns the member cluster names in order.
func (cs *ClusterSet) Names() []string {
	names := make([]string, 0, len(cs.Clusters))
	for _, c := range cs.Clusters {
		names = append(names, c.Name)
	}
	return names
}

// MembersDir is the directory of member kubeconfigs (file name = cluster
// name) that every mci-apiserver is given as --member-kubeconfig-dir. They
// authenticate as a read-only identity allowed only what the Membership
// contract lists.
func (cs *ClusterSet) MembersDir() string { return filepath.Join(cs.Dir, "members") }

// Stop stops every server (mci-apiservers and kube-controller-managers,
// kube-apiservers, then etcd) and
// keeps the directory for inspection: logs, kubeconfigs, certificates.
func (cs *ClusterSet) Stop() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	err := cs.state().stop(cs.Dir, cs.detached)
	for _, c := range cs.Clusters {
		if c.front != nil {
			c.front.close()
		}
	}
	if cs.links != nil {
		cs.links.close()
	}
	return err
}

// Healthy checks that every server runs and answers: etcd and each
// kube-apiserver ready, each kube-controller-manager healthy, each
// APIService Available.
func (cs *ClusterSet) Healthy(ctx context.Context) error {
	var errs []error
	for _, p := range cs.processes() {
		if !p.alive() {
			errs = append(errs, fmt.Errorf("%s (pid %d) is not running", p.Name, p.PID))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if ok, msg := etcdHealthy(cs.etcd.Port)(ctx); !ok {
		errs = append(errs, fmt.Errorf("etcd is not healthy: %s", msg))
	}
	for _, c := range cs.Clusters {
		if ok, msg := apiServerReady(c.Config)(ctx); !ok {
			errs = append(errs, fmt.Errorf("%s kube-apiserver is not ready: %s", c.Name, msg))
			continue
		}
		if c.controllerManager == nil {
			errs = append(errs, fmt.Errorf("%s runs no kube-controller-manager", c.Name))
		} else if ok, msg := controllerManagerHealthy(c.controllerManager.Port, cs.pki.servingCA.certPEM)(ctx); !ok {
			errs = append(errs, fmt.Errorf("%s kube-controller-manager is not healthy: %s", c.Name, msg))
		}
		if c.mciAPIServer == nil {
			continue
		}
		kube, dyn, err := clients(c.Config)
		if err != nil {
			return err
		}
		if ok, msg := apiServiceAvailable(kube, dyn)(ctx); !ok {
			errs = append(errs, fmt.Errorf("%s APIService %s is not Available: %s", c.Name, APIServiceName, msg))
		}
	}
	return errors.Join(errs...)
}

// ProcessInfo describes one server of the ClusterSet.
type ProcessInfo struct {
	Name  string
	PID   int
	Port  int
	Log   string
	Alive bool
}

// Processes lists every server: mci-apiservers, kube-controller-managers,
// kube-apiservers, etcd.
func (cs *ClusterSet) Processes() []ProcessInfo {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var infos []ProcessInfo
	for _, p := range cs.processes() {
		infos = append(infos, ProcessInfo{Name: p.Name, PID: p.PID, Port: p.Port, Log: p.Log, Alive: p.alive()})
	}
	return infos
}

func (cs *ClusterSet) processes() []*process {
	return cs.state().processes()
}

func (cs *ClusterSet) state() *state {
	s := &state{Etcd: cs.etcd, BinDir: cs.binDir, MCIAPIServerBinary: cs.mciBinary, MCIAPIServerModTime: cs.mciModTime}
	for _, c := range cs.Clusters {
		s.Clusters = append(s.Clusters, clusterState{Name: c.Name, APIServer: c.apiServer, ControllerManager: c.controllerManager, MCIAPIServer: c.mciAPIServer, MCIAPIServerReplicas: c.mciReplicas})
	}
	s.DataPath = cs.dataPath
	return s
}

// eachCluster runs f for every cluster at once and joins the errors.
func (cs *ClusterSet) eachCluster(f func(*Cluster) error) error {
	errs := make([]error, len(cs.Clusters))
	var wg sync.WaitGroup
	for i, c := range cs.Clusters {
		wg.Go(func() { errs[i] = f(c) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (cs *ClusterSet) progress(format string, args ...any) {
	fmt.Fprintf(cs.log, "[%5.1fs] %s\n", time.Since(cs.started).Seconds(), fmt.Sprintf(format, args...))
}

func clients(cfg *rest.Config) (kubernetes.Interface, dynamic.Interface, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	return kube, dyn, nil
}
