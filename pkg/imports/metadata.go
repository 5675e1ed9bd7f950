package imports

import (
	"maps"
	"strings"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/types"
)

// uidNamespace is the fixed name-space UUID under which virtual objects'
// uids are derived. Changing it changes every served uid: never do.
var uidNamespace = uuid.MustParse("da7bfa36-8e56-4dd1-b690-18c0db11796e")

const (
	kindImport = "InferencePoolImport"
	kindExport = "InferencePoolExport"
	// A summary, like an export, is one exporting cluster's.
	kindSummary        = "InferencePoolExportSummary"
	kindClusterSummary = "InferenceClusterSummary"
)

// virtualUID derives the uid of a virtual object from what identifies it
// (parts joined by "/"), so that every replica and every restart serves the
// same uid. An import is identified by ClusterSet, kind and namespace/name:
// it is the same logical object in every importing cluster. An export is a
// report of one exporting cluster, so that cluster is part of its identity.
func virtualUID(parts ...string) types.UID {
	return types.UID(uuid.NewSHA1(uidNamespace, []byte(strings.Join(parts, "/"))).String())
}

// copyLabels copies labels of a cached object: the output must never share a
// map with the informer cache.
func copyLabels(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	return maps.Clone(in)
}
