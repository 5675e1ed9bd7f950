package extproc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// TLSOptions are the flags of a process's serving certificate. Set, every
// port of the process serves TLS with it: ext_proc and gRPC health with
// gRPC's TLS credentials, /metrics over HTTPS. The health port too, because
// importers reach an EPP's three ports with the same credentials (the
// import's secretRefs); kubelet's gRPC probes speak plaintext, so probe such
// a process with tcpSocket (or an exec probe that speaks TLS).
type TLSOptions struct {
	CertFile string
	KeyFile  string
	// ClientCAFile, set, makes every port require a client certificate
	// that chains to one of its CAs (mutual TLS).
	ClientCAFile string
}

// AddFlags adds --tls-cert-file, --tls-private-key-file and
// --tls-client-ca-file to fs.
func (o *TLSOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.CertFile, "tls-cert-file", o.CertFile, "PEM serving certificate (followed by its intermediates) for the ext_proc, gRPC health and metrics ports. Set, with --tls-private-key-file, every port serves TLS (metrics over HTTPS). The files are read again when they change.")
	fs.StringVar(&o.KeyFile, "tls-private-key-file", o.KeyFile, "PEM private key of --tls-cert-file.")
	fs.StringVar(&o.ClientCAFile, "tls-client-ca-file", o.ClientCAFile, "PEM bundle of CAs. Set, every port requires a client certificate signed by one of them (mutual TLS). Needs --tls-cert-file.")
}

// Enabled reports whether the process serves TLS.
func (o TLSOptions) Enabled() bool { return o.CertFile != "" || o.KeyFile != "" }

// Validate checks that the flags go together and that the files load, so
// that a mistake stops the process at start rather than at the first
// handshake.
func (o TLSOptions) Validate() []error {
	var errs []error
	if o.CertFile != "" && o.KeyFile == "" {
		errs = append(errs, errors.New("--tls-cert-file needs --tls-private-key-file"))
	}
	if o.CertFile == "" && o.KeyFile != "" {
		errs = append(errs, errors.New("--tls-private-key-file needs --tls-cert-file"))
	}
	if o.ClientCAFile != "" && o.CertFile == "" {
		errs = append(errs, errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-private-key-file: client certificates are asked for in a TLS handshake"))
	}
	if len(errs) == 0 && o.Enabled() {
		if _, err := o.load(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// servingMaterial is what a handshake is served with.
type servingMaterial struct {
	config *tls.Config
}

func (o TLSOptions) load() (*servingMaterial, error) {
	cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file %s with --tls-private-key-file %s: %w", o.CertFile, o.KeyFile, err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if o.ClientCAFile != "" {
		var pool *x509.CertPool
		if pool, err = certutil.NewPool(o.ClientCAFile); err != nil {
			return nil, fmt.Errorf("--tls-client-ca-file: %w", err)
		}
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, pool
	}
	return &servingMaterial{config: c}, nil
}

// stamp identifies the files' contents by their modification times and
// sizes: a mounted Secret is updated by swapping in new files.
func (o TLSOptions) stamp() string {
	var b strings.Builder
	for _, f := range []string{o.CertFile, o.KeyFile, o.ClientCAFile} {
		if f == "" {
			continue
		}
		if fi, err := os.Stat(f); err == nil {
			b.WriteString(strconv.FormatInt(fi.ModTime().UnixNano(), 10) + "/" + strconv.FormatInt(fi.Size(), 10))
		}
		b.WriteByte(';')
	}
	return b.String()
}

// ServerConfig returns the server TLS configuration of o; nil when TLS is
// off. Its handshakes use the files' current contents: they are checked at
// most once a second, on a handshake, and material that does not load (a
// rotation half done) keeps the last good one in use.
func (o TLSOptions) ServerConfig() (*tls.Config, error) {
	if !o.Enabled() {
		return nil, nil
	}
	stamp := o.stamp()
	m, err := o.load()
	if err != nil {
		return nil, err
	}
	r := &reloader{o: o, m: m, stamp: stamp, checked: time.Now(), logger: klog.Background().WithName("tls")}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.current().config, nil
		},
	}, nil
}

// reloader keeps the serving material of TLSOptions current.
type reloader struct {
	o      TLSOptions
	logger klog.Logger

	mu      sync.Mutex
	m       *servingMaterial
	stamp   string
	failed  string
	checked time.Time
}

func (r *reloader) current() *servingMaterial {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < time.Second {
		return r.m
	}
	r.checked = time.Now()
	stamp := r.o.stamp()
	if stamp == r.stamp {
		return r.m
	}
	m, err := r.o.load()
	if err != nil {
		if stamp != r.failed {
			r.failed = stamp
			r.logger.Error(err, "Serving TLS files changed but do not load; serving the last good ones")
		}
		return r.m
	}
	r.m, r.stamp, r.failed = m, stamp, ""
	r.logger.Info("Serving TLS files reloaded", "certFile", r.o.CertFile, "clientCAFile", r.o.ClientCAFile)
	return m
}
