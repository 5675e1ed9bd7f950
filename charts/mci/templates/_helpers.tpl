{{/*
mci.image renders a container's image and pull policy. Argument: a dict of
image ({registry, repository, tag, pullPolicy}), root, and global (true for
mci's own images, whose registry defaults to global.imageRegistry). The tag
defaults to the chart's appVersion, and an empty pullPolicy leaves it to
Kubernetes.
*/}}
{{- define "mci.image" -}}
{{- $registry := .image.registry | default "" }}
{{- if and (not $registry) .global }}
{{- $registry = (.root.Values.global).imageRegistry | default "" }}
{{- end }}
{{- $repository := .image.repository }}
{{- with $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
image: {{ printf "%s:%s" $repository (.image.tag | default .root.Chart.AppVersion | toString) | quote }}
{{- with .image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/*
mci.labels renders the labels every object carries: the recommended
app.kubernetes.io labels and helm.sh/chart. Argument: a list of the root
context, the component's name ("" for objects the components share: the
name is then mci) and, optionally, its component label (default: from the
name). name, component and part-of are those of the kustomize bases of
artifacts/deploy too; instance, version, managed-by and helm.sh/chart are
Helm's (the chart test compares the rest).
*/}}
{{- define "mci.labels" -}}
{{- $root := index . 0 }}
{{- $name := index . 1 }}
{{- $component := get (dict "mci-apiserver" "apiserver" "inference-gateway" "gateway" "mci-sidecar" "gateway" "mci-epp" "endpoint-picker") $name }}
{{- if gt (len .) 2 }}
{{- $component = index . 2 }}
{{- end -}}
app.kubernetes.io/name: {{ $name | default "mci" }}
app.kubernetes.io/component: {{ $component }}
app.kubernetes.io/part-of: mci
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
mci.podMetadata renders a pod template's metadata: the labels of
mci.labels plus the component's podLabels, and its podAnnotations.
Argument: a dict of root, name (as mci.labels), values (the component's)
and labels (more labels the selector needs, optional).
*/}}
{{- define "mci.podMetadata" -}}
labels:
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- include "mci.labels" (list .root .name) | nindent 2 }}
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
mci.podScheduling renders where and how a component's pods are scheduled
and pulled: priorityClassName, imagePullSecrets (global.imagePullSecrets
and the component's), nodeSelector, tolerations, affinity and
topologySpreadConstraints. Argument: a dict of root and values (the
component's). Empty values render nothing.
*/}}
{{- define "mci.podScheduling" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- $secrets := concat ((.root.Values.global).imagePullSecrets | default list) (.values.imagePullSecrets | default list) }}
{{- with $secrets }}
imagePullSecrets:
  {{- range . }}
  {{- if kindIs "string" . }}
  - name: {{ . }}
  {{- else }}
  - {{ toYaml . | nindent 4 | trim }}
  {{- end }}
  {{- end }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
mci.eppNamespace is the namespace of mci-epp: that of its InferencePool.
*/}}
{{- define "mci.eppNamespace" -}}
{{- .Values.epp.namespace | default .Release.Namespace }}
{{- end }}

{{/*
mci.gatewayNamespace is the namespace of the Inference Gateway (Envoy and
mci-sidecar), apart from mci-apiserver's, which holds the member
credentials. It refuses the release's namespace while mci-apiserver is
installed.
*/}}
{{- define "mci.gatewayNamespace" -}}
{{- $ns := .Values.sidecar.namespace | default "" }}
{{- if not $ns }}
{{- fail "sidecar.namespace is empty: name the namespace of the Inference Gateway (default mci-gateway), apart from mci-apiserver's" }}
{{- end }}
{{- if and .Values.apiserver.enabled (eq $ns .Release.Namespace) }}
{{- fail (printf "sidecar.namespace is %q, the release's namespace, where mci-apiserver keeps the member credentials: the Inference Gateway faces the network and must run in a namespace of its own (default mci-gateway), so that no grant on the gateway's namespace (its operators', its workloads') reaches those Secrets" $ns) }}
{{- end }}
{{- $ns }}
{{- end }}

{{/*
mci.apiserverTLSMode validates apiserver.tls.mode and prints it.
*/}}
{{- define "mci.apiserverTLSMode" -}}
{{- $mode := .Values.apiserver.tls.mode }}
{{- if not (has $mode (list "selfSigned" "certManager")) }}
{{- fail (printf "apiserver.tls.mode is %q: it must be selfSigned (the server keeps its own certificate) or certManager" $mode) }}
{{- end }}
{{- $mode }}
{{- end }}

{{/*
mci.gateways validates sidecar.gateways (the schema does too, but not with
--skip-schema-validation) and prints them.
*/}}
{{- define "mci.gateways" -}}
{{- if not .Values.sidecar.gateways }}
{{- fail "sidecar.gateways is empty: name the Gateway object(s) this Inference Gateway serves (namespace/name, e.g. mci-gateway/inference-gateway). mci-sidecar then routes only the HTTPRoutes their listeners' allowedRoutes accept; without any it would route every HTTPRoute of the cluster, whoever wrote it" }}
{{- end }}
{{- toJson .Values.sidecar.gateways }}
{{- end }}
