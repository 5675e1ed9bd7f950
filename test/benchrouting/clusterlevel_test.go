package benchrouting

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
)

const (
	// clusterLevelEPPHost is the host, in each cluster's loopback block,
	// of the cluster-level oracle's mci-epp, and the next one of its
	// gateway.
	clusterLevelEPPHost = 170
	// eppExtProcPort is mci-epp's ext_proc port on its bind address.
	eppExtProcPort = "9002"
)

// startClusterLevelEPPs starts, for ClusterOracle's runs, a second mci-epp
// per cluster as the data path starts its own (Kubernetes mode, the same
// pool and servers) but with its prefix filter off
// (--prefix-queue-margin=-1), and a gateway of the harness to each, and
// waits until each answers a request. Only the run's requests reach these
// EPPs (the data path's own EPPs are idle meanwhile), so they see all the
// load, as the data path's do in the other runs. stop kills them.
func (e *env) startClusterLevelEPPs(ctx context.Context) (targets []target, stop func(), err error) {
	var started processes
	stop = started.stop
	defer func() {
		if err != nil {
			stop()
		}
	}()
	for i, cluster := range clusterNames {
		c, err := e.cs.Cluster(cluster)
		if err != nil {
			return nil, stop, err
		}
		ip := fmt.Sprintf("127.0.%d.%d", e.cfg.LoopbackBlock+i, clusterLevelEPPHost)
		p, err := e.startProcess(cluster+"-cluster-level-mci-epp", "mci-epp",
			"--pool-name="+e.dp.Pool, "--pool-namespace="+e.dp.Namespace, "--kubeconfig="+c.Kubeconfig,
			"--bind-address="+ip, "--base-models="+e.dp.Model, "--prefix-queue-margin=-1", "-v=2")
		if err != nil {
			return nil, stop, err
		}
		started.procs = append(started.procs, p)
		base, closeGateway, err := startDirectGateway(net.JoinHostPort(ip, eppExtProcPort), fmt.Sprintf("127.0.%d.%d", e.cfg.LoopbackBlock+i, clusterLevelEPPHost+1))
		if err != nil {
			return nil, stop, err
		}
		started.closers = append(started.closers, closeGateway)
		targets = append(targets, target{cluster: cluster, base: base})
	}
	for _, t := range targets {
		if err := e.waitRoutes(ctx, t.base); err != nil {
			return nil, stop, fmt.Errorf("cluster-level mci-epp of %s (logs in %s): %w", t.cluster, filepath.Join(e.dir, "logs"), err)
		}
	}
	logf("  cluster-level mci-epps up (prefix filter off): %v", targets)
	return targets, stop, nil
}
