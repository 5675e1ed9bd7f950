{{/*
mci.image renders a container's image and pull policy from an image value
({repository, tag, pullPolicy}); the tag defaults to the chart's appVersion,
and an empty pullPolicy leaves it to Kubernetes.
*/}}
{{- define "mci.image" -}}
image: {{ printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion | toString) | quote }}
{{- with .image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/*
mci.labels renders the labels every object of a component carries: the same
as artifacts/deploy, so that the chart and the kustomize bases render the
same objects. Argument: the component's name, or "" for objects shared by
the components (the Namespace, the member reader).
*/}}
{{- define "mci.labels" -}}
{{- with . -}}
app.kubernetes.io/name: {{ . }}
{{ end -}}
app.kubernetes.io/part-of: mci
{{- end }}

{{/*
mci.eppNamespace is the namespace of mci-epp: that of its InferencePool.
*/}}
{{- define "mci.eppNamespace" -}}
{{- .Values.epp.namespace | default .Release.Namespace }}
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
