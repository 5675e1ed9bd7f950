package benchrouting

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mci-dev/mci/test/localclusterset"
)

const (
	// maxReplicas bounds "<policy>@<n>".
	maxReplicas = 3
	// replicaHost is the host, in the importing cluster's loopback block,
	// of the first extra mci-sidecar replica (and its gateway); the next
	// ones follow.
	replicaHost = 160
	// dataPathSidecarService is the Service the local shim pool names as
	// its endpointPickerRef.
	dataPathSidecarService = "mci-sidecar"
)

// startReplicas starts n more mci-sidecar replicas of the importing
// cluster, each started as the data path starts its own (same kubeconfig,
// Gateway and shim Service, its own loopback address) with a gateway
// (test/cmd/gateway) in front, and waits until each routes a request.
// They read the route's current cluster policy as they start. stop kills
// them.
func (e *env) startReplicas(ctx context.Context, n int) (gateways []string, stop func(), err error) {
	var started processes
	stop = started.stop
	defer func() {
		if err != nil {
			stop()
		}
	}()
	for i := range n {
		gw, err := e.startSidecar(&started, fmt.Sprintf("replica-%d", i+2), importingCluster, replicaHost+i)
		if err != nil {
			return nil, stop, err
		}
		gateways = append(gateways, gw)
	}
	for i, gw := range gateways {
		if err := e.waitRoutes(ctx, gw); err != nil {
			return nil, stop, fmt.Errorf("sidecar replica %d (logs in %s): %w", i+2, filepath.Join(e.dir, "logs"), err)
		}
	}
	logf("  %d more mci-sidecar replicas up: %v", n, gateways)
	return gateways, stop, nil
}

// startSidecar starts an mci-sidecar of cluster on host of its loopback
// block, as the data path starts its own, with a gateway in front, into
// started; its logs are <name>-mci-sidecar.log and <name>-gateway.log. In
// the importing cluster it serves the local shim pool, as the data path's
// does; in another it serves a Gateway whose route names the import
// (localclusterset's ApplyImportingGateway). It returns the gateway's base
// URL, not waiting for it to route.
func (e *env) startSidecar(started *processes, name, cluster string, host int) (string, error) {
	c, err := e.cs.Cluster(cluster)
	if err != nil {
		return "", err
	}
	ip := e.hostIP(cluster, host)
	args := []string{"--kubeconfig=" + c.Kubeconfig, "--bind-address=" + ip, "--local-cluster-name=" + cluster,
		"--gateway=" + e.dp.Namespace + "/" + localclusterset.DataPathGatewayName, "-v=2",
		"--metrics-endpoint-auth=false", "--insecure-remote-endpoint-pickers=*", "--allow-loopback-destinations"}
	if cluster == importingCluster {
		args = append(args, "--endpoint-picker-service="+e.dp.Namespace+"/"+dataPathSidecarService)
	}
	sidecar, err := e.startProcess(name+"-mci-sidecar", "mci-sidecar", args...)
	if err != nil {
		return "", err
	}
	started.procs = append(started.procs, sidecar)
	gw, err := e.startProcess(name+"-gateway", "gateway",
		"--listen="+net.JoinHostPort(ip, strconv.Itoa(localclusterset.DataPathGatewayPort)), "--ext-proc="+net.JoinHostPort(ip, "9002"))
	if err != nil {
		return "", err
	}
	started.procs = append(started.procs, gw)
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(localclusterset.DataPathGatewayPort)), nil
}

// hostIP is the loopback address of host in cluster's block.
func (e *env) hostIP(cluster string, host int) string {
	return fmt.Sprintf("127.0.%d.%d", e.cfg.LoopbackBlock+indexOf(allClusters, cluster), host)
}

// processes are what a step of the harness started, stopped together:
// the processes killed, after the closers run.
type processes struct {
	procs   []*exec.Cmd
	closers []func()
}

func (p *processes) stop() {
	for _, c := range p.closers {
		c()
	}
	for _, cmd := range p.procs {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// startProcess starts binary of the data path's bin directory, its output
// in logs/<name>.log.
func (e *env) startProcess(name, binary string, args ...string) (*exec.Cmd, error) {
	logs := filepath.Join(e.dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(logs, name+".log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	cmd := exec.Command(filepath.Join(e.binDir(), binary), args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return cmd, nil
}

// waitRoutes waits until a completion request through gateway is
// answered.
func (e *env) waitRoutes(ctx context.Context, gateway string) error {
	last := errors.New("not tried")
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/v1/completions", strings.NewReader(e.dp.CompletionBody()))
		if err != nil {
			return false, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := adminClient.Do(req)
		if err != nil {
			last = err
			return false, nil
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("HTTP %d", resp.StatusCode)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("no request answered through %s: %w (last: %v)", gateway, err, last)
	}
	return nil
}

func indexOf(list []string, s string) int {
	for i, e := range list {
		if e == s {
			return i
		}
	}
	return -1
}
