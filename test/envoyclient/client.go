// Package envoyclient is a test double of the Envoy side of ext_proc: Client
// drives an ext_proc server as Envoy does with the Inference Gateway's
// settings (artifacts/envoy/envoy.yaml, as in the Gateway API Inference
// Extension's examples: request headers SEND, request body
// FULL_DUPLEX_STREAMED, request trailers SEND; response headers SEND,
// response body FULL_DUPLEX_STREAMED, response trailers SEND), and Proxy is
// a tiny Envoy-like HTTP gateway built on it that asks an Endpoint Picker
// where each request goes, forwards it there, and runs the response through
// the same ext_proc stream, reporting the endpoint that served it
// (x-gateway-destination-endpoint-served) as the Endpoint Picker protocol
// asks of a gateway. Envoy is not available on the machines this project is
// tested on; these stand in for it.
package envoyclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mci-dev/mci/pkg/extproc"
)

// DefaultChunkSize is the body chunk size when a Request sets none: Envoy
// passes a body on as the codec delivers it, typically in 16 KiB pieces.
const DefaultChunkSize = 16 << 10

// ErrMessageTimeout means the server did not answer within
// Options.MessageTimeout, which Envoy turns into a 504 ("ext_proc message
// timeout") unless it fails open.
var ErrMessageTimeout = errors.New("ext_proc message timeout")

// Options configure a Client.
type Options struct {
	// MessageTimeout bounds the wait for each message of the server, as
	// Envoy's message_timeout (200ms there by default) does. Zero: only the
	// context of Do bounds it.
	MessageTimeout time.Duration
}

// Client drives ext_proc servers. It is safe for concurrent use; each Do
// opens a Process stream of its own, as Envoy does for each HTTP request.
type Client struct {
	ext  extprocv3.ExternalProcessorClient
	conn *grpc.ClientConn
	opts Options
}

// New returns a client that uses cc, which the caller keeps and closes.
func New(cc grpc.ClientConnInterface, opts Options) *Client {
	return &Client{ext: extprocv3.NewExternalProcessorClient(cc), opts: opts}
}

// Dial returns a client of its own connection to target ("host:port"),
// plaintext unless dialOpts say otherwise. Close closes the connection.
func Dial(target string, opts Options, dialOpts ...grpc.DialOption) (*Client, error) {
	// Fixed flow-control windows, as Envoy's HTTP/2 codec has: no
	// bandwidth-delay probing, whose pings the server would answer on every
	// stream.
	dialOpts = append(append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		extproc.StreamDialOptions()...), dialOpts...)
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to ext_proc server %s: %w", target, err)
	}
	c := New(conn, opts)
	c.conn = conn
	return c, nil
}

// Close closes the connection Dial opened; it does nothing for New.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Request is one HTTP request as the gateway hands it to ext_proc.
type Request struct {
	// Method is ":method"; default POST.
	Method string
	// Path is ":path", the path and query; default "/".
	Path string
	// Authority is ":authority"; default "mci-gateway".
	Authority string
	// Headers are the caller's headers; the client adds content-type
	// application/json when a body comes without one, and content-length
	// for a Body.
	Headers http.Header
	// Body is the request body. BodyReader, when set, is used instead and
	// streamed as it is read, chunk by chunk, the way Envoy passes on a body
	// still arriving; a reader that blocks leaves the stream in the middle
	// of the body.
	Body       []byte
	BodyReader io.Reader
	// ChunkSize is the size of the body chunks sent; default
	// DefaultChunkSize.
	ChunkSize int
	// Metadata is sent as the metadata_context of the headers message: the
	// filter metadata Envoy forwards, e.g. mciextproc.SubsetHintMetadata(...).
	Metadata *corev3.Metadata
	// Attributes are sent as the attributes of the headers message: what
	// Envoy's request_attributes ask for, such as source.address.
	Attributes map[string]*structpb.Struct
	// Response, when set, is the upstream's response, which Do runs through
	// the response phase once the request phase is answered; without one
	// the stream ends with the request phase, as Envoy's does when the
	// request never reaches an upstream.
	Response *Response
}

// Result is the server's answer to one request.
type Result struct {
	// Immediate is set when the server answered with an immediate response
	// (an error, for an Endpoint Picker) instead of letting the request go
	// on; then the other fields hold what was known before it.
	Immediate *ImmediateResponse
	// Destination is the endpoint the request goes to ("ip:port"), the first
	// of the x-gateway-destination-endpoint value; Fallbacks are the others,
	// in order.
	Destination string
	Fallbacks   []string
	// Headers are the request headers after the server's mutations,
	// pseudo-headers (":path", ...) included.
	Headers http.Header
	// Body is the body the server streamed back: what goes upstream.
	Body []byte
	// DynamicMetadata is the dynamic metadata the server set, merged over
	// its responses.
	DynamicMetadata *structpb.Struct
	// Response is what the server made of Request.Response, when there was
	// one.
	Response *ResponseResult
}

// ImmediateResponse is a response the server asked the gateway to send to
// the client.
type ImmediateResponse struct {
	StatusCode int
	Headers    http.Header
	Body       []byte
	// Details is the server's explanation for logs.
	Details string
}

// Do runs one request through the server: it sends the headers, then the
// body in chunks without waiting for an answer (FULL_DUPLEX_STREAMED), and
// reads the answers until the server has answered the headers and streamed
// the whole body back, or answered with an immediate response; then, for a
// request with a Response, the response phase (Exchange.Respond). It
// returns an error when the stream fails or the server breaks the protocol.
func (c *Client) Do(ctx context.Context, req Request) (*Result, error) {
	return c.do(ctx, req, nil)
}

// do is Do; answered, when not nil, is set to when the answer was whole,
// before the stream is closed: what a gateway's client waits for, as Envoy
// closes the stream after it has passed the answer on.
func (c *Client) do(ctx context.Context, req Request, answered *time.Time) (*Result, error) {
	if answered != nil {
		defer func() {
			if answered.IsZero() {
				*answered = time.Now()
			}
		}()
	}
	x, err := c.Start(ctx, req)
	if err != nil || x.Result.Immediate != nil {
		if x != nil {
			return x.Result, err
		}
		return nil, err
	}
	defer x.Close()
	if req.Response != nil {
		rec := &recordingSink{}
		res := &ResponseResult{}
		res.Immediate, err = x.Respond(*req.Response, rec)
		if err != nil {
			x.Reset()
			return x.Result, err
		}
		res.Status, res.Headers, res.Body, res.Trailers = rec.status, rec.headers, rec.body, rec.trailers
		x.Result.Response = res
	}
	if answered != nil {
		*answered = time.Now()
	}
	return x.Result, nil
}

// Exchange is one request's ext_proc stream after its request phase: the
// server's answer (Result) and the stream, kept for the response phase.
type Exchange struct {
	// Result is the server's answer to the request phase.
	Result *Result

	stream   extprocv3.ExternalProcessor_ProcessClient
	cancel   context.CancelFunc
	opts     Options
	timedOut *atomic.Bool
	watchdog *time.Timer
}

// Start runs the request phase of req (see Do) and returns the exchange,
// whose stream stays open for the response phase until Close or Reset.
// After an error or an immediate response the stream is already reset, as
// Envoy resets it, and the returned Exchange only carries the Result.
func (c *Client) Start(ctx context.Context, req Request) (*Exchange, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.ext.Process(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening ext_proc stream: %w", err)
	}

	headers := requestHeaders(req)
	hasBody := req.BodyReader != nil || len(req.Body) > 0
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     toHeaderMap(headers),
			EndOfStream: !hasBody,
		}},
		MetadataContext: req.Metadata,
		Attributes:      req.Attributes,
		// What Envoy announces for the Inference Gateway's processing
		// mode.
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}

	// The sender runs beside the receiver, as in Envoy: the server may answer
	// (an immediate response) before the whole body is sent.
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := stream.Send(first); err != nil || !hasBody {
			return
		}
		_ = sendBody(stream, req)
	})

	// Envoy's message timeout: each answer must come within it.
	x := &Exchange{stream: stream, cancel: cancel, opts: c.opts, timedOut: &atomic.Bool{}}
	if c.opts.MessageTimeout > 0 {
		x.watchdog = time.AfterFunc(c.opts.MessageTimeout, func() {
			x.timedOut.Store(true)
			cancel()
		})
	}
	res, err := receive(stream, headers, hasBody, x.gotMessage)
	x.stopWatchdog()
	x.Result = res
	if x.timedOut.Load() || err != nil || res.Immediate != nil {
		// Envoy resets the stream once it has its answer or gives up. The
		// sender then fails at its next Send; one blocked reading a
		// BodyReader ends when the reader returns, which Do does not wait for.
		cancel()
		if req.BodyReader == nil {
			wg.Wait()
		}
		if x.timedOut.Load() {
			return x, ErrMessageTimeout
		}
		return x, err
	}
	wg.Wait()
	return x, nil
}

func (x *Exchange) gotMessage() {
	if x.watchdog != nil {
		x.watchdog.Reset(x.opts.MessageTimeout)
	}
}

func (x *Exchange) armWatchdog() {
	if x.watchdog != nil {
		x.watchdog.Reset(x.opts.MessageTimeout)
	}
}

func (x *Exchange) stopWatchdog() {
	if x.watchdog != nil {
		x.watchdog.Stop()
	}
}

// Close ends the exchange as Envoy does once processing is complete: it
// ends its side of the stream and lets the server end its own, so that the
// server sees a clean io.EOF rather than a reset; a server that lingers is
// reset after a second.
func (x *Exchange) Close() {
	x.stopWatchdog()
	_ = x.stream.CloseSend()
	linger := time.AfterFunc(time.Second, x.cancel)
	defer linger.Stop()
	for {
		if _, err := x.stream.Recv(); err != nil {
			break
		}
	}
	x.cancel()
}

// Reset resets the stream, as Envoy does when the client goes away.
func (x *Exchange) Reset() {
	x.stopWatchdog()
	x.cancel()
}
