package localclusterset

import "text/template"

// dataPathPod is a model server's pod: its name and loopback address.
type dataPathPod struct {
	Name string
	IP   string
}

// exportingClusterTemplate is a cluster's pool, model servers and EPP. The
// pool is exported; or, with .Shim (the gateway cluster's local pool of
// DataPathOptions.LocalPool), a shim pool whose endpointPickerRef is
// mci-sidecar's Service .Shim and whose real EPP the sidecar finds through
// the annotation mci.x-k8s.io/local-endpoint-picker. The rest is what a
// kubelet, the EndpointSlice controller and a LoadBalancer controller would
// have written for the pool too: the pods Running and Ready with their addresses, the EPP Service's ingress
// address and a ready endpoint (documentation range: slices refuse
// loopback), so the import's cluster entry is Ready.
var exportingClusterTemplate = template.Must(template.New("exporting").Parse(`
apiVersion: v1
kind: Namespace
metadata:
  name: {{.Namespace}}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: {{.Pool}}
  namespace: {{.Namespace}}
  annotations:
{{- if .Shim}}
    mci.x-k8s.io/local-endpoint-picker: {{.Pool}}-epp
{{- else}}
    inference.networking.x-k8s.io/export: "ClusterSet"
    inference.networking.x-k8s.io/export-mode: "EndpointMode"
{{- end}}
spec:
  selector:
    matchLabels:
      app: {{.Pool}}
  targetPorts:
  - number: {{.ModelServerPort}}
  endpointPickerRef:
{{- if .Shim}}
    name: {{.Shim}}
{{- else}}
    name: {{.Pool}}-epp
{{- end}}
    port:
      number: {{.GRPCPort}}
    failureMode: FailOpen
---
apiVersion: v1
kind: Service
metadata:
  name: {{.Pool}}-epp
  namespace: {{.Namespace}}
spec:
  type: LoadBalancer
  selector:
    app: {{.Pool}}-epp
  ports:
  - name: ext-proc
    port: {{.GRPCPort}}
    appProtocol: http2
  - name: health
    port: {{.HealthPort}}
  - name: metrics
    port: {{.MetricsPort}}
status:
  loadBalancer:
    ingress:
    - ip: {{.EPPIP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {{.Pool}}-epp-1
  namespace: {{.Namespace}}
  labels:
    kubernetes.io/service-name: {{.Pool}}-epp
addressType: IPv4
endpoints:
- addresses: ["192.0.2.100"]
  conditions:
    ready: true
ports:
- name: ext-proc
  port: {{.GRPCPort}}
  protocol: TCP
{{- range .Pods}}
---
apiVersion: v1
kind: Pod
metadata:
  name: {{.Name}}
  namespace: {{$.Namespace}}
  labels:
    app: {{$.Pool}}
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai
    ports:
    - containerPort: {{$.ModelServerPort}}
status:
  phase: Running
  podIP: {{.IP}}
  podIPs:
  - ip: {{.IP}}
  conditions:
  - type: Ready
    status: "True"
{{- end}}
`))

// gatewayClusterTemplate is the gateway cluster's side: the namespace (an
// import is served only where its namespace exists), the Gateway the
// sidecar serves, programmed at the gateway's address, and an HTTPRoute
// from /v1 to the import (with DataPathOptions.LocalPool: to the local shim
// pool, whose clusters are the local one and the import's).
var gatewayClusterTemplate = template.Must(template.New("gateway").Parse(`
apiVersion: v1
kind: Namespace
metadata:
  name: {{.Namespace}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: {{.Gateway}}
  namespace: {{.Namespace}}
spec:
  gatewayClassName: mci-local
  listeners:
  - name: http
    protocol: HTTP
    port: {{.Port}}
status:
  addresses:
  - type: IPAddress
    value: {{.IP}}
  conditions:
  - type: Accepted
    status: "True"
    reason: Accepted
    message: Accepted by the local ClusterSet's data path
    lastTransitionTime: "2026-01-01T00:00:00Z"
  - type: Programmed
    status: "True"
    reason: Programmed
    message: Served by test/cmd/gateway with mci-sidecar
    lastTransitionTime: "2026-01-01T00:00:00Z"
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {{.Pool}}
  namespace: {{.Namespace}}
spec:
  parentRefs:
  - name: {{.Gateway}}
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /v1
    backendRefs:
{{- if .LocalPool}}
    - group: inference.networking.k8s.io
      kind: InferencePool
      name: {{.Pool}}
{{- else}}
    - group: inference.networking.x-k8s.io
      kind: InferencePoolImport
      name: {{.Pool}}
{{- end}}
`))
