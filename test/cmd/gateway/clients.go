package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mci-dev/mci/test/envoyclient"
)

// transportCredentials are the credentials of --ext-proc-tls.
func transportCredentials(mode string) (credentials.TransportCredentials, error) {
	switch mode {
	case "plaintext":
		return insecure.NewCredentials(), nil
	case "skip-verify":
		// What gateways do with an EPP's self-signed certificate.
		return credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}), nil //nolint:gosec // the behaviour reproduced
	}
	return nil, fmt.Errorf("--ext-proc-tls %q: want plaintext or skip-verify", mode)
}

// handlerMaker returns what makes the handler of the requests that ask
// the ext_proc server at an address, for --ext-proc-client: the handler
// and what closes it.
func handlerMaker(kind string, creds credentials.TransportCredentials, messageTimeout time.Duration) (func(addr string) (http.Handler, func(), error), error) {
	switch kind {
	case "envoy":
		return func(addr string) (http.Handler, func(), error) {
			client, err := envoyclient.Dial(addr, envoyclient.Options{MessageTimeout: messageTimeout}, grpc.WithTransportCredentials(creds))
			if err != nil {
				return nil, func() {}, err
			}
			return envoyclient.NewProxy(client, nil), func() { _ = client.Close() }, nil
		}, nil
	case "ngf":
		return func(addr string) (http.Handler, func(), error) {
			return newNGFShim(addr, creds, messageTimeout), func() {}, nil
		}, nil
	}
	return nil, fmt.Errorf("--ext-proc-client %q: want envoy or ngf", kind)
}

// routeByHost is the handler that asks, for each request, the ext_proc
// server routes names for its host, else def; closeAll closes them all.
func routeByHost(def string, routes map[string]string, newHandler func(addr string) (http.Handler, func(), error)) (_ http.Handler, closeAll func(), _ error) {
	var closers []func()
	closeAll = func() {
		for _, c := range closers {
			c()
		}
	}
	byAddr := map[string]http.Handler{}
	handlerOf := func(addr string) (http.Handler, error) {
		if h := byAddr[addr]; h != nil {
			return h, nil
		}
		h, c, err := newHandler(addr)
		closers = append(closers, c)
		byAddr[addr] = h
		return h, err
	}
	fallback, err := handlerOf(def)
	if err != nil {
		return nil, closeAll, err
	}
	byHost := map[string]http.Handler{}
	for host, addr := range routes {
		if byHost[host], err = handlerOf(addr); err != nil {
			return nil, closeAll, err
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if h := byHost[host]; h != nil {
			h.ServeHTTP(w, r)
			return
		}
		fallback.ServeHTTP(w, r)
	}), closeAll, nil
}
