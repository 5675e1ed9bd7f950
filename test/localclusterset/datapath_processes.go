package localclusterset

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// DataPathServer describes one server of the data path.
type DataPathServer struct {
	Name string
	PID  int
	// Address is where it serves: ip:port.
	Address string
	Log     string
	Alive   bool
}

// DataPathServers lists the data path's servers, in the order they started.
func (cs *ClusterSet) DataPathServers() []DataPathServer {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var out []DataPathServer
	for _, p := range cs.dataPath {
		out = append(out, DataPathServer{Name: p.Name, PID: p.PID, Address: listenAddress(p), Log: p.Log, Alive: p.alive()})
	}
	return out
}

// listenAddress finds a data path server's address in its flags.
func listenAddress(p *process) string {
	for _, a := range p.Args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			return v
		}
		if v, ok := strings.CutPrefix(a, "--bind-address="); ok {
			return net.JoinHostPort(v, strconv.Itoa(p.Port))
		}
	}
	return ""
}

func (cs *ClusterSet) dataPathProcess(name, binary string, port int, args ...string) *process {
	return &process{Name: name, Binary: binary, Args: args, Port: port, Log: filepath.Join(cs.Dir, "logs", name+".log")}
}

// startDataPathProcess starts p and records it at once, so that Down finds
// it even if the caller dies before the data path is up.
func (cs *ClusterSet) startDataPathProcess(p *process) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if err := p.start(cs.detached); err != nil {
		return err
	}
	cs.dataPath = append(cs.dataPath, p)
	return cs.saveState()
}

// applyTemplate renders tmpl with data and applies the objects to cluster.
func (cs *ClusterSet) applyTemplate(ctx context.Context, cluster string, tmpl *template.Template, data any) error {
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		return fmt.Errorf("rendering %s: %w", tmpl.Name(), err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(&buf), 4096)
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("decoding %s: %w", tmpl.Name(), err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	_, err := cs.Apply(ctx, cluster, objs...)
	return err
}

var importsGVR = schema.GroupVersionResource{Group: MCIGroup, Version: MCIVersion, Resource: "inferencepoolimports"}

// importReady checks that the import lists every one of clusters with a
// True Ready condition.
func importReady(dyn dynamic.Interface, ns, name string, clusters []string) func(context.Context) (bool, string) {
	return func(ctx context.Context) (bool, string) {
		imp, err := dyn.Resource(importsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		entries, _, _ := unstructured.NestedSlice(imp.Object, "status", "clusters")
		var ready []string
		for _, e := range entries {
			entry, _ := e.(map[string]any)
			conds, _, _ := unstructured.NestedSlice(entry, "conditions")
			for _, c := range conds {
				cond, _ := c.(map[string]any)
				if cond["type"] == "Ready" && cond["status"] == "True" {
					ready = append(ready, fmt.Sprint(entry["name"]))
				}
			}
		}
		for _, c := range clusters {
			if !slices.Contains(ready, c) {
				return false, fmt.Sprintf("Ready clusters %v, want %v", ready, clusters)
			}
		}
		return true, ""
	}
}

// grpcServing checks the gRPC health "readiness" service, which mci-epp
// and mci-sidecar turn SERVING once they can route.
func grpcServing(addr string) func(context.Context) (bool, string) {
	return func(ctx context.Context) (bool, string) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = conn.Close() }()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		if err != nil {
			return false, err.Error()
		}
		return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, resp.GetStatus().String()
	}
}

// httpOK checks that GET url answers 200.
func httpOK(url string) func(context.Context) (bool, string) {
	return func(ctx context.Context) (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := loopbackClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	}
}

// loopbackClient talks to the data path directly, whatever the
// environment's proxy settings.
var loopbackClient = func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}()
