package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// TestEPPDiscoversModelServersFromEndpointSlicesAndTheirMetadata runs
// mci-epp with seed 002's discovery: the ready endpoints of a Service's
// real EndpointSlices in cluster-a, identified by targetRef, and each
// simulator's /metadata naming the models it serves, so that a request
// goes only to servers of its model.
//
// kube-apiserver refuses loopback addresses in EndpointSlices, so the
// slices carry documentation-range addresses (192.0.2.x) that nothing is
// sent to, and mci-epp runs with --model-server-address=pod-ip: it sends
// requests and /metadata fetches to the targetRef Pod's status.podIP,
// which may be loopback and is where each simulator listens (in a cluster
// the two addresses are the same one, written by the EndpointSlice
// controller from the Pod).
func TestEPPDiscoversModelServersFromEndpointSlicesAndTheirMetadata(t *testing.T) {
	const (
		ns      = "e2e-epp-slices"
		block   = 75
		service = "model-servers"
	)
	ctx := t.Context()
	c := clusterClients(t, "cluster-a")
	c.createNamespace(t, ctx, ns)
	_, err := c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": "pool"}},
			TargetPorts:       []poolv1.Port{{Number: modelServerPort}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: eppGRPCPort}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "pool"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: modelServerPort}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	// Model servers, each with its pod (Running, Ready, its loopback podIP)
	// and its /metadata: two serve "llama" (one with an adapter), one
	// "qwen".
	// A fourth, "plain-1", serves no /metadata, as a plain vLLM server; it
	// joins the slice last.
	servers := []struct {
		pod        string
		model      string
		adapters   []string
		noMetadata bool
	}{{"llama-1", "llama", []string{"llama-sql"}, false}, {"llama-2", "llama", nil, false}, {"qwen-1", "qwen", nil, false}, {"plain-1", "mistral", nil, true}}
	p := &eppPool{t: t, cluster: c, ns: ns, name: "pool", block: block}
	addr := map[string]string{}
	for i, s := range servers {
		m := &modelServer{pod: s.pod, ip: fmt.Sprintf("127.0.%d.%d", block, i+1)}
		m.sim = startSimulator(t, m.address(), simulator.Options{InstanceID: s.pod, Model: s.model, LoRAAdapters: s.adapters, Latency: time.Millisecond, NoMetadata: s.noMetadata})
		_, err := c.kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: s.pod, Namespace: ns, Labels: map[string]string{"app": "pool"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		p.setReady(m, true)
		p.servers = append(p.servers, m)
		addr[s.pod] = m.address()
	}

	// The Service's EndpointSlice, as the EndpointSlice controller would
	// write it, but with documentation-range addresses.
	ready := map[string]bool{"llama-1": true, "llama-2": true, "qwen-1": true}
	writeSlice := func() {
		t.Helper()
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: service + "-1", Namespace: ns, Labels: map[string]string{
				discoveryv1.LabelServiceName: service,
				discoveryv1.LabelManagedBy:   "e2e.mci.x-k8s.io",
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](modelServerPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
		for i, s := range servers {
			if r, listed := ready[s.pod]; listed {
				slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("192.0.2.%d", i+1)},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r)},
					TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: s.pod},
				})
			}
		}
		slices := c.kube.DiscoveryV1().EndpointSlices(ns)
		cur, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
		if err == nil {
			slice.ResourceVersion = cur.ResourceVersion
			_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		} else {
			_, err = slices.Create(ctx, slice, metav1.CreateOptions{})
		}
		require.NoError(t, err)
	}
	writeSlice()

	e := &eppProcess{ip: fmt.Sprintf("127.0.%d.100", block), pool: "pool"}
	startClusterEPPWith(t, "cluster-a", ns, "pool", e.ip, eppProcessOptions{args: []string{
		"--model-server-discovery=endpointslices",
		"--model-server-service=" + service,
		"--model-server-address=pod-ip",
	}})
	p.epp = e
	e.client, err = envoyclient.Dial(net.JoinHostPort(e.ip, strconv.Itoa(eppGRPCPort)), envoyclient.Options{MessageTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.client.Close() })

	// sees waits until requests for model go exactly to want (addresses,
	// or "HTTP <code>"), each at least once.
	sees := func(model string, want ...string) {
		t.Helper()
		waitfor.Eventually(t, ctx, 15*time.Second, func(context.Context) (bool, string) {
			got := e.destinations(t, model, 30)
			ok := len(got) == len(want)
			for _, w := range want {
				ok = ok && got[w] > 0
			}
			return ok, fmt.Sprintf("destinations of %q %v, want %v", model, got, want)
		})
	}
	sees("llama", addr["llama-1"], addr["llama-2"])
	sees("llama-sql", addr["llama-1"])
	sees("qwen", addr["qwen-1"])
	sees("mistral", "HTTP 404")

	// The destination serves the request: the EPP's address is the
	// simulator's.
	res := e.route(t, "qwen")
	require.Nil(t, res.Immediate)
	resp, err := noProxyClient.Post("http://"+res.Destination+"/v1/completions", "application/json", bytes.NewReader(completion("qwen")))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	answer, err := decodeResponse(body)
	require.NoError(t, err)
	assert.Equal(t, "qwen-1", answer.Instance)

	m, err := instanceGauges(ctx, e)
	require.NoError(t, err)
	assert.Equal(t, 3.0, m["served"], "every instance's metadata names its models: %v", m)

	// Seed 002's event table, through real slices: ready false removes an
	// instance (its adapter is then served by nobody: 404), ready true
	// adds it back, and an endpoint removed from the slice is removed.
	ready["llama-1"] = false
	writeSlice()
	sees("llama-sql", "HTTP 404")
	sees("llama", addr["llama-2"])
	ready["llama-1"] = true
	writeSlice()
	sees("llama-sql", addr["llama-1"])
	delete(ready, "qwen-1")
	writeSlice()
	sees("qwen", "HTTP 404")
	sees("llama", addr["llama-1"], addr["llama-2"])

	// A server without /metadata says nothing of its models: it is a
	// candidate for any model, said by the absent gauge.
	ready["plain-1"] = true
	writeSlice()
	sees("mistral", addr["plain-1"])
	sees("qwen", addr["plain-1"])
	sees("llama", addr["llama-1"], addr["llama-2"], addr["plain-1"])
	m, err = instanceGauges(ctx, e)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"served": 2, "absent": 1, "stale": 0, "unreachable": 0, "invalid": 0, "no-pod-ip": 0}, m)
}

// instanceGauges reads mci_epp_model_server_instances by its metadata
// label.
func instanceGauges(ctx context.Context, e *eppProcess) (map[string]float64, error) {
	m, err := e.metrics(ctx)
	if err != nil {
		return nil, err
	}
	got := map[string]float64{}
	for _, x := range m.Samples("mci_epp_model_server_instances") {
		got[x.Labels["metadata"]] = x.Value
	}
	return got, nil
}
