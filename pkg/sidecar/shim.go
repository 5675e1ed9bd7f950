package sidecar

import (
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/extproc"
)

// shimFor finds the shim pool a request is for, in this order: the pool
// the gateway's filter metadata names; the only shim pool; the only shim
// pool among the backendRefs of the request's HTTPRoute rule. Without one
// it returns nil with the status and message to answer.
func (t *Table) shimFor(req *extproc.Request, attrs *RequestAttrs) (*Backend, int, string) {
	if v := req.Metadata.GetFilterMetadata()[ShimMetadataNamespace].GetFields()[ShimPoolKey].GetStringValue(); v != "" {
		ns, name, ok := strings.Cut(v, "/")
		if !ok || ns == "" || name == "" {
			return nil, http.StatusBadRequest, fmt.Sprintf("the gateway's metadata %s/%s is %q, not namespace/name", ShimMetadataNamespace, ShimPoolKey, v)
		}
		if be := t.shims[types.NamespacedName{Namespace: ns, Name: name}]; be != nil {
			return be, 0, ""
		}
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("InferencePool %s, which the gateway's metadata names, does not name mci-sidecar's Service as its endpointPickerRef", v)
	}
	switch len(t.shimList) {
	case 0:
		return nil, http.StatusServiceUnavailable, "no InferencePool names mci-sidecar's Service as its endpointPickerRef"
	case 1:
		return t.shimList[0], 0, ""
	}
	// The gateway applies the rule's filters itself in shim mode: only the
	// pool is taken from it.
	if rule, _ := t.Match(attrs); rule != nil {
		var found *Backend
		for _, be := range rule.Backends {
			if !be.Shim || be.Invalid != "" {
				continue
			}
			if found != nil && (found.Namespace != be.Namespace || found.Name != be.Name) {
				found = nil
				break
			}
			found = be
		}
		if found != nil {
			return found, 0, ""
		}
	}
	return nil, http.StatusInternalServerError, fmt.Sprintf("%d InferencePools use mci-sidecar as their endpoint picker and neither the gateway's metadata (%s/%s) nor the request's HTTPRoute rule says which one this request is for",
		len(t.shimList), ShimMetadataNamespace, ShimPoolKey)
}

// localOnly returns the backend restricted to the shim pool's local EPP,
// failing closed: what a request relayed by another cluster's sidecar may
// use.
func (b *Backend) localOnly() *Backend {
	out := *b
	out.Clusters = nil
	out.FailureMode = poolv1.FailClose
	if b.Local != nil {
		c := *b.Local
		c.Weight = 1
		out.Local = &c
		out.Clusters = []*Cluster{&c}
	}
	out.wrr = newClusterWRR("relayed", out.Clusters)
	return &out
}
