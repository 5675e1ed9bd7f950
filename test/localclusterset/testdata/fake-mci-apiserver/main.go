// Command fake-mci-apiserver stands in for cmd/mci-apiserver in the tests
// of package clusterset: it accepts exactly the flags the harness passes
// (so a change to that contract fails here first) and serves just enough
// for the aggregator to mark its APIService Available, plus a "whoami"
// path that echoes the identity the aggregator forwarded.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
)

const groupVersion = "inference.networking.x-k8s.io/v1alpha1"

func main() {
	flags := flag.NewFlagSet("fake-mci-apiserver", flag.ContinueOnError)
	flags.String("cluster-name", "", "")
	flags.String("clusterset-name", "", "")
	flags.String("kubeconfig", "", "")
	flags.String("authentication-kubeconfig", "", "")
	flags.String("authorization-kubeconfig", "", "")
	memberDir := flags.String("member-kubeconfig-dir", "", "")
	flags.String("namespace", "", "")
	port := flags.Int("secure-port", 0, "")
	bind := flags.String("bind-address", "", "")
	certFile := flags.String("tls-cert-file", "", "")
	keyFile := flags.String("tls-private-key-file", "", "")
	flags.Duration("shutdown-delay-duration", 0, "")
	flags.Bool("shutdown-send-retry-after", false, "")
	flags.Int("v", 0, "")
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if _, err := os.Stat(*memberDir); err != nil {
		log.Fatalf("--member-kubeconfig-dir: %v", err)
	}

	mux := http.NewServeMux()
	// The harness waits for /readyz, as for the real server.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/apis/"+groupVersion, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{
			"kind":         "APIResourceList",
			"apiVersion":   "v1",
			"groupVersion": groupVersion,
			"resources": []map[string]any{{
				"name": "inferencepoolimports", "singularName": "inferencepoolimport", "namespaced": true,
				"kind": "InferencePoolImport", "verbs": []string{"get", "list", "watch"},
			}},
		})
	})
	mux.HandleFunc("/apis/"+groupVersion+"/whoami", func(w http.ResponseWriter, r *http.Request) {
		var clientCN string
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			clientCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		writeJSON(w, map[string]any{
			"server":   "fake-mci-apiserver",
			"user":     r.Header.Get("X-Remote-User"),
			"groups":   r.Header.Values("X-Remote-Group"),
			"clientCN": clientCN,
		})
	})
	server := &http.Server{
		Addr:    net.JoinHostPort(*bind, strconv.Itoa(*port)),
		Handler: mux,
		// Ask for, but do not verify, the client certificate: the test only
		// reads which one the aggregator presented.
		TLSConfig: &tls.Config{ClientAuth: tls.RequestClientCert},
	}
	fmt.Println("serving on", server.Addr)
	log.Fatal(server.ListenAndServeTLS(*certFile, *keyFile))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
