package soak

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The rotation a platform team does most is the renewal of a member
// kube-apiserver's serving certificate: same CA, new key and serial
// (kubeadm's "certs renew", a certificate manager's renewal). Every
// mci-apiserver that watches the member holds its watches open on
// connections made with the old certificate while the kube-apiserver
// reloads the new one. A CA rotation changes the member Secrets of every
// watcher and every other client of the member as well; the Secret side of
// it is the secret-rotation fault's, which this one leaves alone.

// renewalConfigMap is the object whose change a watch opened before the
// renewal must still deliver after it.
const renewalConfigMap = "soak-cert-renewal"

// renewalReload bounds how long the kube-apiserver may take to serve the
// renewed certificate to new connections: it watches its files, and reads
// them again every minute whatever it is told.
const renewalReload = 90 * time.Second

// renewCert renews Target's kube-apiserver serving certificate while a
// watch is open on it and checks, in the record of f, that new connections
// verify the new certificate against the member's CA and that the watch
// opened on the old certificate goes on delivering changes. What must not
// happen, no request through the gateway failing in its window and every
// view equal to a fresh LIST after it, the monitor and the report judge.
func (in *injector) renewCert(ctx context.Context, f fault) error {
	m, err := in.cs.Cluster(f.Target)
	if err != nil {
		return err
	}
	stream, err := openServedWatch(ctx, m.Config, in.kube[f.Target])
	if err != nil {
		return err
	}
	defer stream.stop()
	renewed, err := in.cs.RenewAPIServerCertificate(f.Target)
	if err != nil {
		return err
	}
	written := time.Now()
	in.log("fault %s: serving certificate renewed (serial %x)", f, renewed.SerialNumber)
	newConns := check{Target: fmt.Sprintf("#%d %s %s: a new connection verifies the renewed certificate against the member's CA within %s", f.ID, f.Kind, f.Target, renewalReload)}
	last, err := awaitServed(ctx, m.Config, renewed.SerialNumber)
	if err != nil {
		newConns.Figure = fmt.Sprintf("not served in %s (last: %v)", renewalReload, last)
	} else {
		newConns.OK = true
		newConns.Figure = fmt.Sprintf("served %.2fs after it was written", time.Since(written).Seconds())
	}
	inFlight := check{Target: fmt.Sprintf("#%d %s %s: a watch opened on the old certificate delivers a change made after the renewal", f.ID, f.Kind, f.Target)}
	inFlight.OK, inFlight.Figure = stream.deliversChange(ctx, renewed.SerialNumber)
	in.record(f.ID, newConns, inFlight)
	return nil
}

// servedWatch is a watch of one ConfigMap on a connection of its own,
// which records the serial number of the certificate it verified.
type servedWatch struct {
	kube   kubernetes.Interface
	cancel context.CancelFunc
	w      watch.Interface

	mu     sync.Mutex
	serial *big.Int
}

func openServedWatch(ctx context.Context, cfg *rest.Config, admin kubernetes.Interface) (*servedWatch, error) {
	s := &servedWatch{kube: admin}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		s.mu.Lock()
		s.serial = cs.PeerCertificates[0].SerialNumber
		s.mu.Unlock()
		return nil
	}
	own := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true}}
	client, err := kubernetes.NewForConfigAndClient(rest.CopyConfig(cfg), own)
	if err != nil {
		return nil, err
	}
	cms := admin.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	cm, err := cms.Get(ctx, renewalConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: renewalConfigMap}}, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("the ConfigMap the renewal's watch follows: %w", err)
	}
	watchCtx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	s.w, err = client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Watch(watchCtx, metav1.ListOptions{
		ResourceVersion: cm.ResourceVersion,
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", renewalConfigMap).String(),
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening the renewal's watch: %w", err)
	}
	return s, nil
}

// deliversChange changes the ConfigMap and waits for the watch to deliver
// it; the watch must have been opened on a certificate other than renewed.
func (s *servedWatch) deliversChange(ctx context.Context, renewed *big.Int) (bool, string) {
	s.mu.Lock()
	opened := s.serial
	s.mu.Unlock()
	if opened == nil || opened.Cmp(renewed) == 0 {
		return false, fmt.Sprintf("the watch was not opened on the old certificate (serial %x)", opened)
	}
	stamp := strconv.FormatInt(time.Now().UnixNano(), 10)
	cms := s.kube.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	cm, err := cms.Get(ctx, renewalConfigMap, metav1.GetOptions{})
	if err == nil {
		cm.Data = map[string]string{"renewed": stamp}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return false, "changing the ConfigMap: " + err.Error()
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-s.w.ResultChan():
			if !ok {
				return false, fmt.Sprintf("the watch opened on the old certificate (serial %x) ended", opened)
			}
			if got, isCM := ev.Object.(*corev1.ConfigMap); isCM && got.Data["renewed"] == stamp {
				return true, fmt.Sprintf("opened on serial %x, delivered the change after the renewal", opened)
			}
		case <-timeout:
			return false, fmt.Sprintf("the watch opened on the old certificate (serial %x) did not deliver the change in 10s", opened)
		}
	}
}

func (s *servedWatch) stop() {
	s.w.Stop()
	s.cancel()
}

// awaitServed dials the kube-apiserver of cfg until the certificate a new
// connection verifies (against cfg's CA) has serial number want.
func awaitServed(ctx context.Context, cfg *rest.Config, want *big.Int) (string, error) {
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return "", err
	}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return "", err
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, renewalReload, true, func(ctx context.Context) (bool, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: tlsConfig}
		conn, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		defer func() { _ = conn.Close() }()
		got := conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber
		last = fmt.Sprintf("serial %x", got)
		return got.Cmp(want) == 0, nil
	})
	return last, err
}
