package podstart

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// runProbe runs probe against the container's pod IP as a kubelet does:
// first after initialDelaySeconds, then every periodSeconds, each attempt
// within timeoutSeconds, until successThreshold attempts in a row pass.
// It fails when the probe has not passed within initialDelaySeconds +
// periodSeconds × failureThreshold (when a kubelet restarts the container
// or keeps the pod unready), or when the process exits, with the
// container's log.
func runProbe(ctx context.Context, kind string, probe *corev1.Probe, p *pod, c *container) error {
	period := seconds(probe.PeriodSeconds, 10)
	timeout := seconds(probe.TimeoutSeconds, 1)
	failures := int(orDefault(probe.FailureThreshold, 3))
	successes := int(orDefault(probe.SuccessThreshold, 1))
	initial := time.Duration(probe.InitialDelaySeconds) * time.Second
	budget := initial + period*time.Duration(failures)
	start := time.Now()

	attempt, err := prober(probe, p, c)
	if err != nil {
		return fmt.Errorf("%s probe of %s in %s/%s: %w", kind, c.spec.Name, p.namespace, p.name, err)
	}
	wait := initial
	var passed, failed int
	var last error
	for {
		select {
		case <-time.After(wait):
		case <-c.done:
			return fmt.Errorf("%s probe of %s in %s/%s: the process ended (%v) before the probe passed\n%s", kind, c.spec.Name, p.namespace, p.name, c.exitErr(), c.logTail())
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = period
		actx, cancel := context.WithTimeout(ctx, timeout)
		last = attempt(actx)
		cancel()
		if last == nil {
			passed++
			failed = 0
			if passed >= successes {
				return nil
			}
			continue
		}
		passed = 0
		failed++
		if failed >= failures || time.Since(start)+period > budget {
			return fmt.Errorf("%s probe %s of %s in %s/%s failed %d times in %s (its budget: initialDelaySeconds %s + periodSeconds %s × failureThreshold %d), last: %w\n%s",
				kind, describe(probe), c.spec.Name, p.namespace, p.name, failed, time.Since(start).Round(time.Millisecond), initial, period, failures, last, c.logTail())
		}
	}
}

// prober returns one attempt of the probe's handler.
func prober(probe *corev1.Probe, p *pod, c *container) (func(context.Context) error, error) {
	switch h := probe.ProbeHandler; {
	case h.HTTPGet != nil:
		port, err := resolvePort(h.HTTPGet.Port, c.spec)
		if err != nil {
			return nil, err
		}
		host := h.HTTPGet.Host
		if host == "" {
			host = p.ip
		}
		scheme := strings.ToLower(string(h.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := h.HTTPGet.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		url := scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + path
		// A kubelet does not verify the certificate of an HTTPS probe, and
		// does not follow redirects to other hosts.
		client := &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as a kubelet probes
			DisableKeepAlives: true,
		}}
		return func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			req.Header.Set("User-Agent", "kube-probe/1.36")
			for _, hd := range h.HTTPGet.HTTPHeaders {
				req.Header.Set(hd.Name, hd.Value)
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			if resp.StatusCode < 200 || resp.StatusCode >= 400 {
				return fmt.Errorf("GET %s: %d: %s", url, resp.StatusCode, body)
			}
			return nil
		}, nil
	case h.TCPSocket != nil:
		port, err := resolvePort(h.TCPSocket.Port, c.spec)
		if err != nil {
			return nil, err
		}
		host := h.TCPSocket.Host
		if host == "" {
			host = p.ip
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		return func(ctx context.Context) error {
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			return conn.Close()
		}, nil
	case h.GRPC != nil:
		addr := net.JoinHostPort(p.ip, strconv.Itoa(int(h.GRPC.Port)))
		service := ""
		if h.GRPC.Service != nil {
			service = *h.GRPC.Service
		}
		return func(ctx context.Context) error {
			// Plaintext, as a kubelet's gRPC probe.
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			if err != nil {
				return fmt.Errorf("grpc health %s service %q: %w", addr, service, err)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("grpc health %s service %q: %s", addr, service, resp.GetStatus())
			}
			return nil
		}, nil
	case h.Exec != nil:
		return nil, errors.New("exec probes are not run by this test")
	}
	return nil, errors.New("a probe with no handler")
}

// resolvePort is a probe's port: a number, or the name of one of the
// container's ports.
func resolvePort(port intstr.IntOrString, c corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("port %q is not a port of container %s", port.StrVal, c.Name)
}

func describe(probe *corev1.Probe) string {
	switch h := probe.ProbeHandler; {
	case h.HTTPGet != nil:
		return fmt.Sprintf("httpGet %s %s:%s", h.HTTPGet.Scheme, h.HTTPGet.Path, h.HTTPGet.Port.String())
	case h.TCPSocket != nil:
		return "tcpSocket " + h.TCPSocket.Port.String()
	case h.GRPC != nil:
		svc := ""
		if h.GRPC.Service != nil {
			svc = " service " + *h.GRPC.Service
		}
		return fmt.Sprintf("grpc %d%s", h.GRPC.Port, svc)
	}
	return "?"
}

func seconds(v int32, def int32) time.Duration {
	return time.Duration(orDefault(v, def)) * time.Second
}

func orDefault(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// probeContainers runs, for every started container of p, its startup
// probe (unless it already passed, for a native sidecar) and then its
// readiness and liveness probes, and returns what failed.
func probeContainers(ctx context.Context, p *pod, startupDone map[string]bool) []error {
	var errs []error
	results := make(chan error)
	n := 0
	for _, c := range p.containers {
		n++
		go func() {
			if s := c.spec.StartupProbe; s != nil && !startupDone[c.spec.Name] {
				if err := runProbe(ctx, "startup", s, p, c); err != nil {
					results <- err
					return
				}
			}
			done := make(chan error, 2)
			for _, probe := range []struct {
				kind  string
				probe *corev1.Probe
			}{{"readiness", c.spec.ReadinessProbe}, {"liveness", c.spec.LivenessProbe}} {
				go func() {
					if probe.probe == nil {
						done <- nil
						return
					}
					done <- runProbe(ctx, probe.kind, probe.probe, p, c)
				}()
			}
			results <- errors.Join(<-done, <-done)
		}()
	}
	for range n {
		if err := <-results; err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
