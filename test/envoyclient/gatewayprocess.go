package envoyclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// GatewayRole is the role of a gateway process: a Proxy that asks one
// ext_proc server, in a process of its own as Envoy is beside the EPPs and
// sidecars it calls. A benchmark that times what reaches its clients runs
// the gateway apart (StartGateway) so that the gateway's own work (its
// allocations and collections, its goroutines) does not stall the client
// and the model-server simulator of the benchmark's process on the paths
// it does not take.
const GatewayRole = "gateway"

// gatewayExtProcEnv carries the ext_proc address of a gateway process.
const gatewayExtProcEnv = "MCI_BENCH_GATEWAY_EXT_PROC"

// StartGateway runs a gateway process (GatewayRole) in front of the
// ext_proc server at extProc and returns its base URL. The test binary's
// TestMain hands child processes to ServeGateway (through RunIfChild).
func StartGateway(tb testing.TB, extProc string) string {
	tb.Helper()
	addr, _ := startProcess(tb, GatewayRole, gatewayExtProcEnv+"="+extProc)
	return "http://" + addr
}

// ServeGateway serves the gateway process of role GatewayRole: it listens
// on a loopback port, says its address through ready and forwards through
// a Proxy until ctx ends. Any other role is an error.
func ServeGateway(ctx context.Context, role string, ready func(addr string)) error {
	if role != GatewayRole {
		return fmt.Errorf("unknown role %q, want %q", role, GatewayRole)
	}
	extProc := os.Getenv(gatewayExtProcEnv)
	if extProc == "" {
		return fmt.Errorf("%s is not set", gatewayExtProcEnv)
	}
	client, err := Dial(extProc, Options{MessageTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = client.Close() }()
	transport := &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	defer transport.CloseIdleConnections()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: NewProxy(client, transport), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	ready(ln.Addr().String())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
