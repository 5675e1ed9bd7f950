package localclusterset

import (
	"context"
	"fmt"
	"slices"
)

// RestartMCIAPIServerWithArgs restarts every replica of cluster's
// mci-apiserver with extra flags after the harness's own (replacing those
// of an earlier call; none restores the harness's command line) and waits
// until its APIService is Available. A test that tries a feature the
// harness does not turn on (a membership source, say) uses it, and
// restores the server when it is done.
func (cs *ClusterSet) RestartMCIAPIServerWithArgs(ctx context.Context, cluster string, extra ...string) error {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return err
	}
	if c.mciAPIServer == nil {
		return fmt.Errorf("clusterset: %s runs no mci-apiserver (Options.MCIAPIServerBinary was empty)", cluster)
	}
	if err := cs.StopMCIAPIServer(cluster); err != nil {
		return err
	}
	cs.mu.Lock()
	for _, p := range c.mciProcesses() {
		p.Args = append(slices.Clone(p.Args[:len(p.Args)-c.mciExtraArgs]), extra...)
	}
	c.mciExtraArgs = len(extra)
	cs.mu.Unlock()
	return cs.StartMCIAPIServer(ctx, cluster)
}
