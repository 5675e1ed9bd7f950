package localclusterset

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

const stateFile = "state.json"

// state is what a detached ClusterSet records in <Dir>/state.json: enough
// for another process to find, check, stop and restart every server.
type state struct {
	Clusters            []clusterState `json:"clusters"`
	Etcd                *process       `json:"etcd"`
	BinDir              string         `json:"binDir"`
	MCIAPIServerBinary  string         `json:"mciAPIServerBinary,omitempty"`
	MCIAPIServerModTime time.Time      `json:"mciAPIServerModTime,omitzero"`
	// DataPath are the servers StartDataPath runs: model-server
	// simulators, mci-epps, mci-sidecar and the test gateway.
	DataPath []*process `json:"dataPath,omitempty"`
}

type clusterState struct {
	Name              string   `json:"name"`
	APIServer         *process `json:"apiServer"`
	ControllerManager *process `json:"controllerManager,omitempty"`
	MCIAPIServer      *process `json:"mciAPIServer,omitempty"`
	// MCIAPIServerReplicas are replicas 1 and up (Options.Replicas > 1).
	MCIAPIServerReplicas []*process `json:"mciAPIServerReplicas,omitempty"`
}

// tiers are the servers in the order they stop: the mci-apiservers and
// kube-controller-managers, which watch the kube-apiservers, then those,
// then the etcd under them all.
func (s *state) tiers() [][]*process {
	var mci, kube, etcd []*process
	for _, c := range s.Clusters {
		if c.MCIAPIServer != nil {
			mci = append(mci, c.MCIAPIServer)
		}
		mci = append(mci, c.MCIAPIServerReplicas...)
		if c.ControllerManager != nil {
			mci = append(mci, c.ControllerManager)
		}
		if c.APIServer != nil {
			kube = append(kube, c.APIServer)
		}
	}
	if s.Etcd != nil {
		etcd = append(etcd, s.Etcd)
	}
	return [][]*process{mci, kube, etcd}
}

func (s *state) processes() []*process {
	var ps []*process
	for _, tier := range s.tiers() {
		ps = append(ps, tier...)
	}
	return ps
}

// stop stops every server, a tier at a time and the servers of a tier
// together, and removes state.json once all are gone.
func (s *state) stop(dir string, removeState bool) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	// The data path first: it watches the kube-apiservers.
	for _, tier := range append([][]*process{s.DataPath}, s.tiers()...) {
		var wg sync.WaitGroup
		for _, p := range tier {
			wg.Go(func() {
				if err := p.stop(stopGrace); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	if len(errs) == 0 && removeState {
		if err := os.Remove(filepath.Join(dir, stateFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func readState(dir string) (*state, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	s := &state{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(dir, stateFile), err)
	}
	// A ClusterSet whose start was interrupted may have no clusters yet.
	if s.Etcd == nil {
		return nil, fmt.Errorf("%s records no etcd", filepath.Join(dir, stateFile))
	}
	for _, c := range s.Clusters {
		if c.APIServer == nil {
			return nil, fmt.Errorf("%s records no kube-apiserver for %s", filepath.Join(dir, stateFile), c.Name)
		}
	}
	return s, nil
}

// writeState replaces state.json in one step, so a concurrent reader never
// sees half of it.
func writeState(dir string, s *state) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return nil
}
