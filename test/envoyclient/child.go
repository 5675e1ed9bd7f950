package envoyclient

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Benchmarks that measure ext_proc servers as a gateway sees them run each
// server in a process of its own, as Envoy, the sidecar and the EPP are in a
// cluster: the test binary re-executes itself in a role (StartChild), and
// its TestMain hands the process over to RunIfChild. Apart, each server's
// CPU time can be read from /proc (Child.CPU), which on a shared machine is
// a far steadier figure than latency.
const (
	// ChildRoleEnv carries the role of a server process.
	ChildRoleEnv = "MCI_BENCH_CHILD"
	// ChildCPUProfileEnv, set to a directory, makes every server process
	// write a CPU profile of itself to <dir>/<role>.cpu.
	ChildCPUProfileEnv = "MCI_BENCH_CPUPROFILE"
)

// Child is a server process of a benchmark and a client of it.
type Child struct {
	Target
	// Addr is the child's ext_proc address, for other children to call.
	Addr string
	pid  int
}

// StartChild runs this test binary as a server process of the given role,
// with env ("KEY=value") added to its environment, and returns a client of
// it. The process serves until the benchmark ends.
func StartChild(tb testing.TB, role string, env ...string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), ChildRoleEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	tb.Cleanup(func() {
		// Closing stdin is what ends the child (RunIfChild).
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(tb, err, "the %s process did not start", role)
	addr = strings.TrimSpace(addr)
	client, err := Dial(addr, Options{})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = client.Close() })
	return &Child{Target: Target{Name: role, Client: client}, Addr: addr, pid: cmd.Process.Pid}
}

// CPU returns the CPU time (user and system) the process has used so far.
func (c *Child) CPU(tb testing.TB) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
	require.NoError(tb, err)
	// The fields after the command name, which ends with the last ')':
	// utime and stime are the 12th and 13th, in clock ticks (100 per
	// second on Linux).
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, err := strconv.ParseInt(fields[11], 10, 64)
	require.NoError(tb, err)
	stime, err := strconv.ParseInt(fields[12], 10, 64)
	require.NoError(tb, err)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// RunIfChild returns at once in a test binary that StartChild did not start.
// In one it did, it runs serve for the role and exits: serve binds its
// ext_proc server, calls ready with its address and serves until ctx ends,
// which happens when the benchmark's process closes the child's stdin, so a
// child never outlives its benchmark. Call it first thing in TestMain.
func RunIfChild(serve func(ctx context.Context, role string, ready func(addr string)) error) {
	role := os.Getenv(ChildRoleEnv)
	if role == "" {
		return
	}
	if err := runChild(role, serve); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(role string, serve func(ctx context.Context, role string, ready func(addr string)) error) error {
	if dir := os.Getenv(ChildCPUProfileEnv); dir != "" {
		f, err := os.Create(filepath.Join(dir, role+".cpu"))
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	// The address goes out once the server is bound; the benchmark's first
	// streams wait for it to serve.
	return serve(ctx, role, func(addr string) { fmt.Println(addr) })
}

// PID is the child's process id.
func (c *Child) PID() int { return c.pid }
