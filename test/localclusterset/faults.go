package localclusterset

import (
	"context"
	"crypto/x509"
	"fmt"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
)

// StopAPIServer stops the kube-apiserver of cluster, as a crash would: its
// clients see connections refused until StartAPIServer.
func (cs *ClusterSet) StopAPIServer(cluster string) error {
	return cs.stopServer(cluster, func(c *Cluster) (*process, error) { return c.apiServer, nil })
}

// StartAPIServer starts the kube-apiserver of cluster again on the same
// port, with the same data, and waits until it is ready: as its admin sees
// it, and as any identity its authorizer is asked about does. A kube-apiserver answers
// its admin's /readyz (system:masters, which no authorizer is asked
// about) a second or more before its RBAC authorizer has read the role
// bindings; until then every other client, the readers of the
// ClusterSet's mci-apiservers among them, gets 403 Forbidden.
func (cs *ClusterSet) StartAPIServer(ctx context.Context, cluster string) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	p, err := cs.restart(&c.apiServer)
	if err != nil {
		return err
	}
	if err := cs.saveState(); err != nil {
		return err
	}
	if err := waitReady(ctx, p, apiServerReadyTimeout, apiServerReady(c.Config)); err != nil {
		return err
	}
	// An identity the authorizer is asked about: its /readyz is allowed
	// by a bootstrap role binding, which the authorizer has read when it
	// has read the readers' (a test may have moved or unbound the
	// members' own identity).
	authorized := rest.CopyConfig(c.Config)
	authorized.Impersonate = rest.ImpersonationConfig{UserName: "localclusterset:readiness", Groups: []string{"system:authenticated"}}
	return waitReady(ctx, p, apiServerReadyTimeout, apiServerReady(authorized))
}

// PauseAPIServer freezes the kube-apiserver of cluster (SIGSTOP): it keeps
// its connections open and answers nothing, as a hung server does.
func (cs *ClusterSet) PauseAPIServer(cluster string) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	return c.apiServer.signal(syscall.SIGSTOP)
}

// ResumeAPIServer lets a paused kube-apiserver run again (SIGCONT).
func (cs *ClusterSet) ResumeAPIServer(cluster string) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	return c.apiServer.signal(syscall.SIGCONT)
}

// StopMCIAPIServer stops the mci-apiserver of cluster, every replica of
// it. The APIService stays, so the aggregator reports it unavailable, as
// when the server crashes.
func (cs *ClusterSet) StopMCIAPIServer(cluster string) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	if c.mciAPIServer == nil {
		return fmt.Errorf("clusterset: %s runs no such server", cluster)
	}
	for r := range c.mciProcesses() {
		if err := cs.StopMCIAPIServerReplica(cluster, r); err != nil {
			return err
		}
	}
	return nil
}

// StartMCIAPIServer starts the mci-apiserver of cluster (every replica)
// again on the same ports and waits until its APIService is Available.
func (cs *ClusterSet) StartMCIAPIServer(ctx context.Context, cluster string) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	if c.mciAPIServer == nil {
		return fmt.Errorf("clusterset: %s runs no mci-apiserver (Options.MCIAPIServerBinary was empty)", cluster)
	}
	for r := range c.mciProcesses() {
		p, _ := c.mciReplica(r)
		if _, err := cs.restart(p); err != nil {
			return err
		}
	}
	if err := cs.saveState(); err != nil {
		return err
	}
	return cs.waitMCIAPIServer(ctx, c)
}

// StopMCIAPIServerReplica stops replica r (0, 1, ... Options.Replicas-1) of
// cluster's mci-apiserver, as when one pod of the Deployment goes away:
// the front stops sending it connections and those it relayed break.
func (cs *ClusterSet) StopMCIAPIServerReplica(cluster string, r int) error {
	return cs.stopServer(cluster, func(c *Cluster) (*process, error) {
		p, err := c.mciReplica(r)
		if err != nil {
			return nil, err
		}
		return *p, nil
	})
}

// StartMCIAPIServerReplica starts replica r of cluster's mci-apiserver
// again on the same port and waits until its /readyz answers.
func (cs *ClusterSet) StartMCIAPIServerReplica(ctx context.Context, cluster string, r int) error {
	p, err := cs.launchMCIAPIServerReplica(cluster, r)
	if err != nil {
		return err
	}
	return waitReady(ctx, p, apiServiceAvailableTimeout, replicaReady(p.Port, cs.pki.mciServingCA.certPEM))
}

// LaunchMCIAPIServerReplica starts replica r of cluster's mci-apiserver
// again on the same port without waiting for it to be ready: a replica
// that starts while a member is unreachable stays unready for as long as
// --member-remove-after. MCIAPIServerReplicaReady says when it is.
func (cs *ClusterSet) LaunchMCIAPIServerReplica(cluster string, r int) error {
	_, err := cs.launchMCIAPIServerReplica(cluster, r)
	return err
}

// MCIAPIServerReplicaReady asks replica r of cluster's mci-apiserver its
// /readyz, as a kubelet's readiness probe would: ready, or why not.
func (cs *ClusterSet) MCIAPIServerReplicaReady(ctx context.Context, cluster string, r int) (bool, string) {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return false, err.Error()
	}
	p, err := c.mciReplica(r)
	if err != nil {
		return false, err.Error()
	}
	return replicaReady((*p).Port, cs.pki.mciServingCA.certPEM)(ctx)
}

func (cs *ClusterSet) launchMCIAPIServerReplica(cluster string, r int) (*process, error) {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return nil, err
	}
	pp, err := c.mciReplica(r)
	if err != nil {
		return nil, err
	}
	p, err := cs.restart(pp)
	if err != nil {
		return nil, err
	}
	return p, cs.saveState()
}

func (cs *ClusterSet) stopServer(cluster string, which func(*Cluster) (*process, error)) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	p, err := which(c)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("clusterset: %s runs no such server", cluster)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return p.stop(stopGrace)
}

// restart starts the stopped server *server again with the same command
// line and replaces it. A server that still runs is left alone.
func (cs *ClusterSet) restart(server **process) (*process, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := *server
	if old.alive() {
		return old, nil
	}
	p := &process{Name: old.Name, Binary: old.Binary, Args: old.Args, Log: old.Log, Port: old.Port}
	cs.progress("starting %s on %s", p.Name, hostPort(p.Port))
	if err := p.start(cs.detached); err != nil {
		return nil, err
	}
	*server = p
	return p, nil
}

// CompactEtcd compacts the ClusterSet's etcd, which every member's
// kube-apiserver shares, to its current revision and returns it: from
// then on a read or watch from an older revision is refused as
// compacted. A watch that is caught up goes on, and so does every
// kube-apiserver's watch cache: restart a kube-apiserver after it to have
// its watchers resume from a revision it no longer has.
func (cs *ClusterSet) CompactEtcd(ctx context.Context) (int64, error) {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + hostPort(cs.etcd.Port)},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return 0, fmt.Errorf("clusterset: connecting to etcd: %w", err)
	}
	defer func() { _ = client.Close() }()
	// Any key: the answer's header carries the store's revision.
	got, err := client.Get(ctx, "/", clientv3.WithCountOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("clusterset: reading etcd's revision: %w", err)
	}
	rev := got.Header.Revision
	if _, err := client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, fmt.Errorf("clusterset: compacting etcd to revision %d: %w", rev, err)
	}
	return rev, nil
}

// RenewAPIServerCertificate issues cluster's kube-apiserver a new serving
// certificate from the same serving CA, with a new key and serial number,
// and writes it over the files its --tls-cert-file and
// --tls-private-key-file name, as a platform team's renewal does. The
// kube-apiserver reloads them when they change, without a restart: the
// connections already open keep the certificate they were opened with,
// new ones get the new one. It returns the new certificate.
func (cs *ClusterSet) RenewAPIServerCertificate(cluster string) (*x509.Certificate, error) {
	if _, err := cs.Cluster(cluster); err != nil {
		return nil, err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	kp, err := cs.pki.servingCA.sign(apiServerCertRequest(cluster))
	if err != nil {
		return nil, err
	}
	if err := cs.pki.replace(apiServerCertName(cluster), kp); err != nil {
		return nil, fmt.Errorf("clusterset: renewing the serving certificate of %s: %w", cluster, err)
	}
	return kp.cert, nil
}
