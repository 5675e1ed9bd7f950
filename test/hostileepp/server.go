package hostileepp

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mci-dev/mci/pkg/extproc"
)

// Credentials are the request headers that carry a client's credentials:
// a sidecar strips them before it relays a request to a remote EPP.
var Credentials = []string{"authorization", "proxy-authorization", "cookie", "x-api-key"}

// Server serves Cases over ext_proc on a loopback address.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cases map[string]*Case
	srv   *grpc.Server
	addr  string
	// big bounds the oversized answers built at once.
	big chan struct{}

	// Unknown counts requests that named no Case, Credentialed those that
	// carried a client's credentials (Credentials).
	Unknown, Credentialed atomic.Int64
}

// Start serves cases on 127.0.0.1 until Stop.
func Start(cases []*Case) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{cases: map[string]*Case{}, addr: lis.Addr().String(), big: make(chan struct{}, 2)}
	for _, c := range cases {
		s.cases[strconv.Itoa(c.ID)] = c
	}
	// Its codec sends a raw message as it is: a garbled stream's bytes.
	s.srv = grpc.NewServer(grpc.ForceServerCodec(codec{}))
	extprocv3.RegisterExternalProcessorServer(s.srv, s)
	go func() { _ = s.srv.Serve(lis) }()
	return s, nil
}

// Addr is the address it serves on.
func (s *Server) Addr() string { return s.addr }

// Stop ends every stream and stops serving.
func (s *Server) Stop() { s.srv.Stop() }

// session is one request's stream.
type session struct {
	stream extprocv3.ExternalProcessor_ProcessServer
	req    *extproc.Request
	srv    *Server
}

func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := extproc.ReadRequest(stream, 0)
	if err != nil {
		return err
	}
	for _, h := range Credentials {
		if req.Header(h) != "" {
			s.Credentialed.Add(1)
			break
		}
	}
	c := s.cases[req.Header(CaseHeader)]
	if c == nil {
		s.Unknown.Add(1)
		return status.Errorf(codes.NotFound, "no case %q", req.Header(CaseHeader))
	}
	sess := &session{stream: stream, req: req, srv: s}
	if err := c.act(sess); err != nil {
		if errors.Is(err, errEnd) {
			return nil
		}
		return err
	}
	if c.respond != nil {
		return c.respond(sess)
	}
	// The answer is whole: wait for the stream to end (the sidecar ends or
	// resets it).
	for {
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

// codec is gRPC's protobuf codec that also sends a raw message unencoded.
type codec struct{}

func (codec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case raw:
		return m, nil
	case proto.Message:
		return proto.Marshal(m)
	}
	return nil, fmt.Errorf("cannot encode %T", v)
}

func (codec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("cannot decode into %T", v)
	}
	return proto.Unmarshal(data, m)
}

func (codec) Name() string { return "proto" }
