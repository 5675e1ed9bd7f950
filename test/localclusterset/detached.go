package localclusterset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// reuse returns the detached ClusterSet already running in Dir when it is
// the one asked for and healthy, and otherwise clears the way for a new one.
func reuse(ctx context.Context, opts Options) (*ClusterSet, error) {
	s, err := readState(opts.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		fmt.Fprintf(opts.Log, "ignoring %s: %v\n", filepath.Join(opts.Dir, stateFile), err)
		return nil, nil
	}
	if !opts.Detached {
		for _, p := range s.processes() {
			if p.alive() {
				return nil, fmt.Errorf("a detached ClusterSet runs from %s (%s is pid %d): stop it first with `go run ./test/cmd/clusterset down --dir=%s`", opts.Dir, p.Name, p.PID, opts.Dir)
			}
		}
		return nil, nil
	}
	cs, err := Load(opts.Dir)
	if err == nil {
		cs.log, cs.started = opts.Log, time.Now()
		reason := cs.differsFrom(opts)
		if reason == "" {
			if err := cs.Healthy(ctx); err != nil {
				reason = err.Error()
			}
		}
		if reason == "" {
			cs.progress("reusing the ClusterSet running from %s", cs.Dir)
			if err := cs.restartChangedMCIAPIServers(ctx); err != nil {
				return nil, err
			}
			return cs, nil
		}
		fmt.Fprintf(opts.Log, "not reusing the ClusterSet in %s (%s): starting a fresh one\n", opts.Dir, reason)
	} else {
		fmt.Fprintf(opts.Log, "not reusing the ClusterSet in %s (%v): starting a fresh one\n", opts.Dir, err)
	}
	if err := down(opts.Dir); err != nil {
		return nil, err
	}
	// The kubeconfigs of clusters that the new ClusterSet may not have.
	for _, c := range s.Clusters {
		_ = os.Remove(filepath.Join(opts.Dir, c.Name+".kubeconfig"))
	}
	return nil, nil
}

// Down stops the detached ClusterSet recorded in dir, exactly the pids of
// its state.json. Nothing running there is not an error.
func Down(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	unlock, err := lockDir(dir, io.Discard)
	if err != nil {
		return err
	}
	defer unlock()
	return down(dir)
}

func down(dir string) error {
	s, err := readState(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.stop(dir, true)
}

// Load attaches to the detached ClusterSet recorded in dir, for `status`
// and for tests that run against a ClusterSet started by
// `make clusterset-up`. Stop on the result stops it.
func Load(dir string) (*ClusterSet, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s, err := readState(dir)
	if err != nil {
		return nil, err
	}
	cs := &ClusterSet{
		Dir:        dir,
		detached:   true,
		binDir:     s.BinDir,
		mciBinary:  s.MCIAPIServerBinary,
		mciModTime: s.MCIAPIServerModTime,
		etcd:       s.Etcd,
		dataPath:   s.DataPath,
		log:        io.Discard,
		started:    time.Now(),
	}
	if cs.pki, err = loadPKI(filepath.Join(dir, "pki")); err != nil {
		return nil, err
	}
	for _, cst := range s.Clusters {
		c := &Cluster{
			Name:              cst.Name,
			Kubeconfig:        filepath.Join(dir, cst.Name+".kubeconfig"),
			Server:            "https://" + hostPort(cst.APIServer.Port),
			apiServer:         cst.APIServer,
			controllerManager: cst.ControllerManager,
			mciAPIServer:      cst.MCIAPIServer,
			mciReplicas:       cst.MCIAPIServerReplicas,
		}
		if c.mciAPIServer != nil {
			c.MCIAPIServerPort = c.mciAPIServer.Port
			c.MCIAPIServerReplicaPorts = []int{c.mciAPIServer.Port}
		}
		cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading %s: %w", c.Kubeconfig, err)
		}
		if c.Config, err = restConfig(cfg); err != nil {
			return nil, err
		}
		cs.Clusters = append(cs.Clusters, c)
	}
	return cs, nil
}

// differsFrom says how a running ClusterSet differs from the one opts ask
// for, or "" when it is the same.
func (cs *ClusterSet) differsFrom(opts Options) string {
	switch {
	case !slices.Equal(cs.Names(), opts.Clusters):
		return fmt.Sprintf("it has clusters %s, not %s", strings.Join(cs.Names(), ","), strings.Join(opts.Clusters, ","))
	case cs.binDir != opts.BinDir:
		return fmt.Sprintf("it runs binaries from %s, not %s", cs.binDir, opts.BinDir)
	case cs.mciBinary != opts.MCIAPIServerBinary:
		return fmt.Sprintf("it runs mci-apiserver %q, not %q", cs.mciBinary, opts.MCIAPIServerBinary)
	}
	for _, c := range cs.Clusters {
		if c.controllerManager == nil {
			return fmt.Sprintf("%s runs no kube-controller-manager (started by an older version)", c.Name)
		}
	}
	return ""
}

// saveState records the servers of a detached ClusterSet; an attached one
// dies with its test and records nothing.
func (cs *ClusterSet) saveState() error {
	if !cs.detached {
		return nil
	}
	return writeState(cs.Dir, cs.state())
}

// restartChangedMCIAPIServers restarts the mci-apiservers of a reused
// ClusterSet when their binary was rebuilt since they started, so that
// `make run` after a code change runs the new code.
func (cs *ClusterSet) restartChangedMCIAPIServers(ctx context.Context) error {
	if cs.mciBinary == "" {
		return nil
	}
	mt, err := modTime(cs.mciBinary)
	if err != nil {
		return err
	}
	if mt.Equal(cs.mciModTime) {
		return nil
	}
	cs.progress("%s was rebuilt: restarting the mci-apiservers", cs.mciBinary)
	cs.mciModTime = mt
	for _, c := range cs.Clusters {
		if err := cs.StopMCIAPIServer(c.Name); err != nil {
			return err
		}
		if err := cs.StartMCIAPIServer(ctx, c.Name); err != nil {
			return err
		}
	}
	return nil
}

// lockDir keeps two commands (a `make run` in each of two terminals) from
// starting or stopping the ClusterSet in dir at the same time.
func lockDir(dir string, log io.Writer) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(log, "waiting for another command working on %s\n", dir)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", dir, err)
		}
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}

func modTime(path string) (time.Time, error) {
	info, err := os.Stat(path)
	if err != nil {
		return time.Time{}, err
	}
	return info.ModTime(), nil
}
