package envoyclient

import (
	"io"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// NullRelay is an ext_proc server that relays each stream to an upstream
// ext_proc server as it is, message by message in both directions, and
// decides nothing. Served with the plumbing of a real relay (the sidecar),
// it is the floor of an extra ext_proc hop: what any relay costs before it
// does its own work.
type NullRelay struct {
	extprocv3.UnimplementedExternalProcessorServer
	upstream extprocv3.ExternalProcessorClient
}

// NewNullRelay returns a relay to the ext_proc server behind cc.
func NewNullRelay(cc grpc.ClientConnInterface) *NullRelay {
	return &NullRelay{upstream: extprocv3.NewExternalProcessorClient(cc)}
}

// Process pipes the gateway's stream to a stream of the upstream server and
// back. The upstream stream lives in the gateway stream's context, so it is
// reset when the gateway's is.
func (r *NullRelay) Process(down extprocv3.ExternalProcessor_ProcessServer) error {
	up, err := r.upstream.Process(down.Context())
	if err != nil {
		return err
	}
	go func() {
		for {
			msg, err := down.Recv()
			if err == io.EOF {
				_ = up.CloseSend()
				return
			}
			if err != nil || up.Send(msg) != nil {
				return
			}
		}
	}()
	for {
		msg, err := up.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := down.Send(msg); err != nil {
			return err
		}
	}
}
