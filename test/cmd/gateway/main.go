// Command gateway is a minimal Envoy-like HTTP gateway for the local
// ClusterSet (`make run`), a test double of Envoy with the ext_proc filter
// of artifacts/envoy/envoy.yaml: for each request it asks an ext_proc
// server (mci-sidecar, or an Endpoint Picker) where the request goes, with
// request headers SEND and the body FULL_DUPLEX_STREAMED, then forwards the
// request as the server left it to the destination the server named in
// x-gateway-destination-endpoint (package test/envoyclient's Proxy):
//
//	gateway --listen=127.0.91.1:8080 --ext-proc=127.0.91.1:9002 [--message-timeout=10s]
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
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/test/envoyclient"
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
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	logger := klog.FromContext(ctx)

	client, err := envoyclient.Dial(*extProc, envoyclient.Options{MessageTimeout: *messageTimeout})
	if err != nil {
		return err
	}
	defer func() { _ = client.Close() }()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	server := &http.Server{
		Handler:           accessLog(logger, envoyclient.NewProxy(client, nil)),
		ReadHeaderTimeout: 10 * time.Second,
	}
	logger.Info("Serving", "address", l.Addr().String(), "extProc", *extProc)
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
