// Package sidecartest builds the objects the sidecar's tests route with
// (HTTPRoutes, InferencePools and their EPP Services, InferencePoolImports,
// Gateways), so that the tests of the routing table and of the server can
// share them wherever each lives. It does not import pkg/sidecar, whose
// own tests use it.
package sidecartest

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// Namespace is the namespace of every object built here.
const Namespace = "example"

// Epoch is the creation time of the oldest route.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// The group and kind of the backendRefs the sidecar routes (Gateway API's
// InferencePool, mci's InferencePoolImport).
const (
	inferencePoolKind       = "InferencePool"
	inferencePoolImportKind = "InferencePoolImport"
)

// Route builds an HTTPRoute in Namespace created at Epoch+age.
func Route(name string, age time.Duration, hostnames []string, rules ...gatewayv1.HTTPRouteRule) *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, CreationTimestamp: metav1.NewTime(Epoch.Add(age))},
		Spec:       gatewayv1.HTTPRouteSpec{Rules: rules},
	}
	for _, h := range hostnames {
		r.Spec.Hostnames = append(r.Spec.Hostnames, gatewayv1.Hostname(h))
	}
	return r
}

// Annotate sets obj's annotations to the key-value pairs kv.
func Annotate[T interface{ SetAnnotations(map[string]string) }](obj T, kv ...string) T {
	a := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		a[kv[i]] = kv[i+1]
	}
	obj.SetAnnotations(a)
	return obj
}

// Rule builds a rule with matches and backendRefs.
func Rule(matches []gatewayv1.HTTPRouteMatch, refs ...gatewayv1.HTTPBackendRef) gatewayv1.HTTPRouteRule {
	return gatewayv1.HTTPRouteRule{Matches: matches, BackendRefs: refs}
}

// Prefix, Exact and Regex are matches of a path.
func Prefix(p string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To(p)}}
}

func Exact(p string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchExact), Value: ptr.To(p)}}
}

func Regex(p string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To(p)}}
}

// WithHeaders, WithMethod and WithQuery add to a match.
func WithHeaders(m gatewayv1.HTTPRouteMatch, kv ...string) gatewayv1.HTTPRouteMatch {
	for i := 0; i < len(kv); i += 2 {
		m.Headers = append(m.Headers, gatewayv1.HTTPHeaderMatch{Name: gatewayv1.HTTPHeaderName(kv[i]), Value: kv[i+1]})
	}
	return m
}

func WithMethod(m gatewayv1.HTTPRouteMatch, method string) gatewayv1.HTTPRouteMatch {
	m.Method = ptr.To(gatewayv1.HTTPMethod(method))
	return m
}

func WithQuery(m gatewayv1.HTTPRouteMatch, kv ...string) gatewayv1.HTTPRouteMatch {
	for i := 0; i < len(kv); i += 2 {
		m.QueryParams = append(m.QueryParams, gatewayv1.HTTPQueryParamMatch{Name: gatewayv1.HTTPHeaderName(kv[i]), Value: kv[i+1]})
	}
	return m
}

// PoolRef and ImportRef are backendRefs to an InferencePool and an
// InferencePoolImport of Namespace; BackendRef to any group and kind.
func PoolRef(name string, weight *int32) gatewayv1.HTTPBackendRef {
	return BackendRef(poolv1.GroupName, inferencePoolKind, name, weight)
}

func ImportRef(name string, weight *int32) gatewayv1.HTTPBackendRef {
	return BackendRef(v1alpha1.GroupName, inferencePoolImportKind, name, weight)
}

func BackendRef(group, kind, name string, weight *int32) gatewayv1.HTTPBackendRef {
	return gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{
			Group: ptr.To(gatewayv1.Group(group)), Kind: ptr.To(gatewayv1.Kind(kind)), Name: gatewayv1.ObjectName(name),
		},
		Weight: weight,
	}}
}

// Pool builds a local InferencePool whose EPP is the Service "<name>-epp".
func Pool(name string, mode poolv1.EndpointPickerFailureMode) *poolv1.InferencePool {
	return &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: name + "-epp", Port: &poolv1.Port{Number: 9002}, FailureMode: mode},
		},
	}
}

// EPPService builds the Service of a pool's EPP at a LoadBalancer address.
func EPPService(poolName, lbIP string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: poolName + "-epp"},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeLoadBalancer,
			ClusterIP: "10.96.0.10",
			Ports: []corev1.ServicePort{
				{Name: "grpc-ext-proc", Port: 9002},
				{Name: "grpc-health", Port: 9003},
				{Name: "http-metrics", Port: 9090},
			},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: lbIP}}}},
	}
}

// Imported is one cluster entry of an import: its EPP's address and port
// (9002 when 0), its Ready condition (True when ""), and, for ParentMode,
// the address of its parent gateway.
type Imported struct {
	Name, Addr string
	Port       int32
	Ready      metav1.ConditionStatus
	Parent     string
	// EndpointAddresses are the addresses the exporter publishes of its
	// pool's endpoints (EndpointMode); DefaultEndpointAddresses when nil.
	EndpointAddresses []string
}

// DefaultEndpointAddresses are the endpoint addresses an imported cluster
// publishes unless told otherwise: the loopback address the tests' model
// servers listen on, and the addresses the sidecar tests' fake EPPs name.
var DefaultEndpointAddresses = []string{"127.0.0.1", "10.0.0.1", "10.1.0.1", "10.2.0.1", "10.3.0.1"}

// Import builds an InferencePoolImport with EndpointMode (or ParentMode)
// clusters whose EPP health and metrics ports are 9003 and 9090.
func Import(name string, clusters ...Imported) *v1alpha1.InferencePoolImport {
	imp := &v1alpha1.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name}}
	for _, c := range clusters {
		ic := v1alpha1.ImportedCluster{Name: c.Name, RoutingMode: v1alpha1.RoutingModeEndpoint, TargetPortNumber: 8000}
		if c.Parent != "" {
			ic.RoutingMode = v1alpha1.RoutingModeParent
			ic.Parents = []v1alpha1.ParentImport{{Name: "gw", Namespace: Namespace, Service: []v1alpha1.ServiceImport{{
				Type: corev1.ServiceTypeLoadBalancer, Addresses: []string{c.Parent}, Ports: []v1alpha1.Port{{Number: 80}, {Number: 443}},
			}}}}
		} else {
			ic.EndpointAddresses = c.EndpointAddresses
			if ic.EndpointAddresses == nil {
				ic.EndpointAddresses = DefaultEndpointAddresses
			}
			port := c.Port
			if port == 0 {
				port = 9002
			}
			ic.EndpointPicker = v1alpha1.EndpointPickerImport{
				Name:    name + "-epp",
				Service: []v1alpha1.ServiceImport{{Type: corev1.ServiceTypeLoadBalancer, Addresses: []string{c.Addr}, Ports: []v1alpha1.Port{{Number: port}}}},
				Health:  &v1alpha1.HealthEndpoint{Port: 9003},
				Metrics: &v1alpha1.MetricsEndpoint{Port: 9090},
			}
		}
		ready := c.Ready
		if ready == "" {
			ready = metav1.ConditionTrue
		}
		ic.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: ready, Reason: "Test"}}
		imp.Status.Clusters = append(imp.Status.Clusters, ic)
	}
	return imp
}

// Gateway builds a Gateway of Namespace with listeners; Listener builds an
// HTTP listener that allows what allowed says (nil: the API's default,
// routes of the Gateway's namespace).
func Gateway(name string, listeners ...gatewayv1.Listener) *gatewayv1.Gateway {
	return &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec:       gatewayv1.GatewaySpec{GatewayClassName: "inference", Listeners: listeners},
	}
}

func Listener(name string, port int32, hostname string, allowed *gatewayv1.AllowedRoutes) gatewayv1.Listener {
	l := gatewayv1.Listener{Name: gatewayv1.SectionName(name), Port: gatewayv1.PortNumber(port), Protocol: gatewayv1.HTTPProtocolType, AllowedRoutes: allowed}
	if hostname != "" {
		l.Hostname = ptr.To(gatewayv1.Hostname(hostname))
	}
	return l
}

// FromNamespaces is an allowedRoutes of routes from the namespaces from
// says (with selector for Selector).
func FromNamespaces(from gatewayv1.FromNamespaces, selector *metav1.LabelSelector) *gatewayv1.AllowedRoutes {
	return &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &from, Selector: selector}}
}

// GatewayClients returns a fake Gateway API clientset holding objs.
// Gateways are added with their resource named: the fake's guess from the
// kind would be "gatewaies".
func GatewayClients(objs ...runtime.Object) *gatewayfake.Clientset {
	var gateways []*gatewayv1.Gateway
	var others []runtime.Object
	for _, o := range objs {
		if g, ok := o.(*gatewayv1.Gateway); ok {
			gateways = append(gateways, g)
		} else {
			others = append(others, o)
		}
	}
	c := gatewayfake.NewSimpleClientset(others...)
	for _, g := range gateways {
		if err := c.Tracker().Create(gatewayv1.SchemeGroupVersion.WithResource("gateways"), g, g.Namespace); err != nil {
			panic(err)
		}
	}
	return c
}

// Fleet is what the benchmarks route over: 200 HTTPRoutes over 100
// InferencePoolImports of three clusters each and 100 local InferencePools
// with their EPP Services.
type Fleet struct {
	Routes   []*gatewayv1.HTTPRoute
	Imports  []*v1alpha1.InferencePoolImport
	Pools    []*poolv1.InferencePool
	Services []*corev1.Service
}

// NewFleet builds the Fleet: route i is host m<i>.model.com, split 50/50
// between pool-<i%100> and its import, whose clusters a, c and d have
// their EPPs at 127.0.2.1, 127.0.3.1 and 127.0.4.1.
func NewFleet() Fleet {
	var f Fleet
	for i := range 100 {
		name := fmt.Sprintf("pool-%03d", i)
		f.Imports = append(f.Imports, Import(name,
			Imported{Name: "a", Addr: "127.0.2.1"}, Imported{Name: "c", Addr: "127.0.3.1"}, Imported{Name: "d", Addr: "127.0.4.1"}))
		f.Pools = append(f.Pools, Pool(name, ""))
		f.Services = append(f.Services, EPPService(name, "127.0.1.1"))
	}
	for i := range 200 {
		name := fmt.Sprintf("pool-%03d", i%100)
		f.Routes = append(f.Routes, Route(fmt.Sprintf("r%03d", i), time.Duration(i), []string{fmt.Sprintf("m%d.model.com", i)},
			Rule([]gatewayv1.HTTPRouteMatch{Prefix("/v1"), WithHeaders(Prefix("/v1/completions"), "x-tier", "gold")},
				PoolRef(name, ptr.To[int32](50)), ImportRef(name, ptr.To[int32](50)))))
	}
	return f
}
