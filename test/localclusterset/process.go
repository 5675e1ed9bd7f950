package localclusterset

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one server of the ClusterSet. It is recorded in state.json as
// is, so that another process (`down`, `status`, a test attaching to a
// running ClusterSet) can find, check, stop and restart it.
type process struct {
	Name   string   `json:"name"`
	Binary string   `json:"binary"`
	Args   []string `json:"args"`
	Log    string   `json:"log"`
	PID    int      `json:"pid"`
	Port   int      `json:"port"`

	// done is closed when the child exits; nil when this process did not
	// start it (a detached ClusterSet loaded from state.json).
	done chan struct{}
}

// start runs the server with its output appended to its log file.
//
// A detached server gets its own session, so that it outlives `go run` and
// a terminal's Ctrl-C. An attached one is killed by the kernel if the test
// binary dies (a -timeout panic, a SIGKILL), so a failed run does not leave
// apiservers behind on a shared machine.
func (p *process) start(detached bool) error {
	if err := os.MkdirAll(filepath.Dir(p.Log), 0o755); err != nil {
		return fmt.Errorf("creating log directory: %w", err)
	}
	logFile, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening log of %s: %w", p.Name, err)
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "\n==== %s starting at %s: %s %s\n", p.Name, time.Now().Format(time.RFC3339), p.Binary, strings.Join(p.Args, " "))

	cmd := exec.Command(p.Binary, p.Args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if detached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.PID = cmd.Process.Pid
	done := make(chan struct{})
	p.done = done
	// Reap the child even when detached, for as long as this process lives:
	// an unreaped child is a zombie that kill(pid, 0) reports as alive.
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

// alive reports whether the recorded pid is still this server. For a
// process started by another program the pid may have been reused, so the
// command line must match too.
func (p *process) alive() bool {
	if p.PID <= 0 {
		return false
	}
	if p.done != nil {
		select {
		case <-p.done:
			return false
		default:
			return true
		}
	}
	if err := syscall.Kill(p.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
	if err != nil {
		return false
	}
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	return string(argv0) == p.Binary
}

// exited is closed when a child started by this process exits; it never
// fires for a process this one did not start.
func (p *process) exited() <-chan struct{} {
	if p.done == nil {
		return nil
	}
	return p.done
}

// stop asks the server to shut down, then kills it. It is quiet about a
// server that is already gone: stopping is what the caller wanted.
func (p *process) stop(grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	_ = syscall.Kill(p.PID, syscall.SIGCONT) // a paused server cannot act on SIGTERM
	if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping %s (pid %d): %w", p.Name, p.PID, err)
	}
	if p.waitGone(grace) {
		return nil
	}
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing %s (pid %d): %w", p.Name, p.PID, err)
	}
	if p.waitGone(10 * time.Second) {
		return nil
	}
	return fmt.Errorf("%s (pid %d) is still running after SIGKILL", p.Name, p.PID)
}

func (p *process) waitGone(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for p.alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func (p *process) signal(sig syscall.Signal) error {
	if !p.alive() {
		return fmt.Errorf("%s is not running", p.Name)
	}
	if err := syscall.Kill(p.PID, sig); err != nil {
		return fmt.Errorf("sending %s to %s (pid %d): %w", sig, p.Name, p.PID, err)
	}
	return nil
}

// logTail returns the last lines of the server's log, for error messages
// that say why a server did not come up.
func (p *process) logTail(lines int) string {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// exitError describes a server that exited while it was awaited.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited; last lines of %s:\n%s", p.Name, p.Log, p.logTail(20))
}

// FreePorts reserves n distinct free ports on 127.0.0.1, below the kernel's
// ephemeral range. The servers bind them later, after others have started:
// a port of the ephemeral range (what listening on port 0 returns) may be
// taken meanwhile as the local port of any outgoing connection (a
// kube-apiserver's to etcd, a client's), and the server then fails with
// "address already in use" (TestLinkFaults did, in CI). Below that range
// only another listener can take it. The listeners are held until all
// ports are chosen so that the same port is not returned twice, and a port
// is never handed out twice in one process: ClusterSets started side by
// side by one test process (parallel subtests) each bind theirs later, so
// a port one was given and has not bound yet looks free to the other.
func FreePorts(n int) ([]int, error) {
	low := ephemeralPortsStart()
	handedOut.Lock()
	defer handedOut.Unlock()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("finding %d free loopback ports below %d: only %d after %d tries", n, low, len(ports), tries)
		}
		port := reservedPortsFloor + rand.IntN(low-reservedPortsFloor)
		if handedOut.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", hostPort(port))
		if err != nil {
			continue // taken: try another
		}
		defer l.Close()
		ports = append(ports, port)
	}
	for _, port := range ports {
		handedOut.ports[port] = true
	}
	return ports, nil
}

// handedOut are the ports FreePorts returned in this process.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// reservedPortsFloor is the lowest port FreePorts chooses: above the
// well-known and most registered ports that daemons listen on.
const reservedPortsFloor = 15000

// ephemeralPortsStart is the first port of the kernel's ephemeral range
// (Linux's ip_local_port_range; 32768, its default, where it cannot be
// read or makes no room below it).
func ephemeralPortsStart() int {
	const linuxDefault = 32768
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return linuxDefault
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low <= reservedPortsFloor+1000 {
		return linuxDefault
	}
	return low
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
