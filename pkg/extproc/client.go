package extproc

import "google.golang.org/grpc"

// StreamDialOptions tune a client connection to an ext_proc server, such as
// the sidecar's to an EPP, for many short streams of a few small messages
// each, as streamServerOptions tune the server: fixed flow-control windows,
// large enough for any request body chunk, turn off the bandwidth-delay
// probing, whose pings the server would otherwise answer on every stream.
func StreamDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(1 << 20),
		grpc.WithInitialConnWindowSize(16 << 20),
	}
}
