package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"
)

// destinationHeader names the endpoint the EPP picked.
const destinationHeader = "x-gateway-destination-endpoint"

// ngfShim asks the EPP at addr as NGINX Gateway Fabric's EPP shim does
// (see the package doc), then forwards the request to the endpoint it
// names, as NGF's nginx does with proxy_pass.
type ngfShim struct {
	addr    string
	creds   credentials.TransportCredentials
	timeout time.Duration
	proxy   *httputil.ReverseProxy
}

type destinationKey struct{}

func newNGFShim(addr string, creds credentials.TransportCredentials, timeout time.Duration) *ngfShim {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	return &ngfShim{addr: addr, creds: creds, timeout: timeout, proxy: &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			dest := pr.In.Context().Value(destinationKey{}).(string)
			pr.SetURL(&url.URL{Scheme: "http", Host: dest})
			pr.Out.URL.Path, pr.Out.URL.RawPath = pr.In.URL.Path, pr.In.URL.RawPath
			pr.Out.Host = pr.In.Host
		},
	}}
}

func (s *ngfShim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	dest, err := s.pick(ctx, r, body)
	if err != nil || dest == "" {
		// NGF's njs logs the EPP's answer and redirects anyway; with no
		// destination a FailClose pool goes to its invalid backend.
		klog.FromContext(r.Context()).V(2).Info("No destination from the EPP", "err", err)
		http.Error(w, fmt.Sprintf("invalid backend (EPP: %v)", err), http.StatusInternalServerError)
		return
	}
	// nginx takes the header's value as the upstream address: a list
	// would not resolve; the first is what the picker chose.
	dest, _, _ = strings.Cut(dest, ",")
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), destinationKey{}, strings.TrimSpace(dest))))
}

// pick runs one request's ext_proc exchange, on a connection of its own.
func (s *ngfShim) pick(ctx context.Context, r *http.Request, body []byte) (string, error) {
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(s.creds))
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return "", err
	}
	if err := send(stream, s.addr, r, body); err != nil {
		return "", err
	}
	dest := ""
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return dest, nil
		}
		if err != nil {
			return "", err
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			return "", fmt.Errorf("immediate response %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
		}
		for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == destinationHeader {
				dest = string(h.GetHeader().GetRawValue())
			}
		}
	}
}

// send sends the headers and the body to the EPP at addr, then closes its
// side.
func send(stream extprocv3.ExternalProcessor_ProcessClient, addr string, r *http.Request, body []byte) error {
	headers := &corev3.HeaderMap{}
	// NGF's njs adds the EPP's host and port to the client's headers for
	// its shim, which passes them all on.
	h := r.Header.Clone()
	host, port, _ := net.SplitHostPort(addr)
	h.Set("X-Epp-Host", host)
	h.Set("X-Epp-Port", port)
	for k, vs := range h {
		for _, v := range vs {
			headers.Headers = append(headers.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), Value: v})
		}
	}
	msgs := []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headers, EndOfStream: len(body) == 0},
	}}}
	if len(body) > 0 {
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
		}})
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return stream.CloseSend()
}
