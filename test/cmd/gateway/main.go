// Command gateway is a minimal HTTP gateway for the local ClusterSet
// (`make run`) and the e2e tests, a test double of the gateways that ask
// an Endpoint Picker (mci-sidecar, or an EPP) where each request goes:
//
//	gateway --listen=127.0.91.1:8080 --ext-proc=127.0.91.1:9002 [--message-timeout=10s]
//	        [--route=HOST=ADDR ...] [--ext-proc-client=envoy|ngf] [--ext-proc-tls=plaintext|skip-verify]
//
// By default it is Envoy with the ext_proc filter of artifacts/envoy/envoy.yaml
// (package test/envoyclient's Proxy): request headers SEND, the body
// FULL_DUPLEX_STREAMED, the response phase through the same stream, in
// plaintext. Options reproduce real gateways at their defaults:
//
//   - --route=HOST=ADDR: requests for HOST ask the EPP at ADDR instead of
//     --ext-proc, as a gateway asks the EPP of the InferencePool that the
//     request's HTTPRoute names (NGINX Gateway Fabric passes that EPP's
//     Service host and port to its EPP shim per route rule).
//   - --ext-proc-tls=skip-verify: TLS to the EPP without verifying its
//     certificate, the upstream EPP default that gateways follow: NGINX
//     Gateway Fabric's endpoint picker flags default to TLS with
//     --endpoint-picker-tls-skip-verify=true (its cmd/gateway/commands.go).
//   - --ext-proc-client=ngf: NGINX Gateway Fabric's EPP shim
//     (cmd/gateway/endpoint_picker.go, called by its njs module epp.js):
//     a new connection per request; the client's headers only (no
//     :authority, :path or :method, so no route to match), in value, not
//     raw_value; the body whole in one message; no protocol configuration
//     and no metadata; its side of the stream closed after the body, the
//     server's answers read until it ends the stream; the destination
//     taken from the answer to the headers; no response phase. An
//     immediate response or no destination answers 500, as NGF's nginx
//     does for a FailClose pool (its invalid-backend upstream) since its
//     fix of July 2026; its FailOpen fallback to the local pool (and, before
//     that fix, for FailClose too) has no counterpart here.
//
// Each request is logged (method, host, path, status, duration). SIGTERM or
// SIGINT stops accepting requests and lets the open ones finish.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve HTTP on")
	extProc := fs.String("ext-proc", "127.0.0.1:9002", "address of the ext_proc server (mci-sidecar or an EPP)")
	messageTimeout := fs.Duration("message-timeout", 10*time.Second, "longest wait for each message of the ext_proc server, as Envoy's message_timeout (a timeout answers 504)")
	routes := map[string]string{}
	fs.Func("route", "HOST=ADDR: requests for HOST ask the ext_proc server at ADDR (repeatable)", func(v string) error {
		host, addr, ok := strings.Cut(v, "=")
		if !ok || host == "" || addr == "" {
			return fmt.Errorf("%q: want HOST=ADDR", v)
		}
		routes[host] = addr
		return nil
	})
	clientKind := fs.String("ext-proc-client", "envoy", "how the gateway speaks ext_proc: envoy, or ngf (NGINX Gateway Fabric's EPP shim)")
	tlsMode := fs.String("ext-proc-tls", "plaintext", "transport to the ext_proc server: plaintext, or skip-verify (TLS without verifying the certificate)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	logger := klog.FromContext(ctx)

	creds, err := transportCredentials(*tlsMode)
	if err != nil {
		return err
	}
	newHandler, err := handlerMaker(*clientKind, creds, *messageTimeout)
	if err != nil {
		return err
	}
	handler, closeAll, err := routeByHost(*extProc, routes, newHandler)
	defer closeAll()
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	server := &http.Server{
		Handler:           accessLog(logger, handler),
		ReadHeaderTimeout: 10 * time.Second,
	}
	logger.Info("Serving", "address", l.Addr().String(), "extProc", *extProc, "routes", routes, "client", *clientKind, "tls", *tlsMode)
	done := make(chan error, 1)
	go func() { done <- server.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	logger.Info("Shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := server.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// accessLog logs every request once answered, as Envoy's access log does.
func accessLog(logger klog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		logger.Info("Request", "method", r.Method, "host", r.Host, "path", r.URL.RequestURI(), "status", rec.status, "duration", time.Since(start))
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// Unwrap lets the proxy flush streamed responses through the recorder.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
