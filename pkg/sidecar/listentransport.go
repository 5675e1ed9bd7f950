package sidecar

import (
	"errors"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/statelog"
)

// selfSignedHost is the subject of the self-signed serving certificate.
const selfSignedHost = "mci-sidecar"

// extProcTransport makes what the ext_proc ports serve: the server options
// that say it (none for plaintext, or for a given certificate, which
// extproc.Listen serves on every port), with its metrics in reg:
// mci_sidecar_ext_proc_transport{transport} (1 for the one served) and,
// for self-signed TLS, mci_sidecar_ext_proc_connections_total{transport,
// result} by what each connection spoke. A connection refused (plaintext
// to a port that serves TLS only) or whose handshake failed is logged
// once per change of its error.
func extProcTransport(t extproc.ListenerTransport, bindAddress string, services []types.NamespacedName, reg prometheus.Registerer, logger logr.Logger) ([]grpc.ServerOption, error) {
	served := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mci_sidecar_ext_proc_transport",
		Help: "What the ext_proc ports serve: 1 for the transport in use (plaintext, self-signed, self-signed-or-plaintext, certificate).",
	}, []string{"transport"})
	reg.MustRegister(served)
	served.WithLabelValues(string(t)).Set(1)
	if t != extproc.ListenerSelfSigned && t != extproc.ListenerSelfSignedOrPlaintext {
		return nil, nil
	}
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_ext_proc_connections_total",
		Help: "Connections to the ext_proc ports by what the client spoke (tls, plaintext) and result (served; failed: refused or handshake failed, see the logs), when the sidecar serves a self-signed certificate.",
	}, []string{"transport", "result"})
	reg.MustRegister(conns)
	cfg, err := extproc.SelfSignedConfig(selfSignedHost, bindAddress, serviceNames(services))
	if err != nil {
		return nil, err
	}
	var failures statelog.Log[string]
	observe := func(spoke string, err error) {
		if err == nil {
			conns.WithLabelValues(spoke, "served").Inc()
			return
		}
		conns.WithLabelValues(spoke, "failed").Inc()
		msg := err.Error()
		if errors.Is(err, extproc.ErrPlaintextRefused) {
			msg = extproc.ErrPlaintextRefused.Error()
		}
		if failures.Observe(spoke, "", msg).Loud() {
			logger.Info("A gateway's connection to the ext_proc port failed its handshake (counted in mci_sidecar_ext_proc_connections_total; logged again when the error changes)",
				"spoke", spoke, "transport", t, "err", err)
		}
	}
	creds := extproc.SniffingCredentials(cfg, t == extproc.ListenerSelfSignedOrPlaintext, observe)
	return []grpc.ServerOption{grpc.Creds(creds)}, nil
}

// serviceNames are the DNS names of the sidecar's Services, which the
// self-signed certificate is made out to (gateways do not verify it; a
// client that pins it sees a name it expects).
func serviceNames(services []types.NamespacedName) []string {
	names := []string{"localhost"}
	for _, s := range services {
		names = append(names, s.Name+"."+s.Namespace+".svc", s.Name+"."+s.Namespace+".svc.cluster.local")
	}
	return names
}
