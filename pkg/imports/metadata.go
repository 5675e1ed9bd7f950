package imports

import (
	"maps"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/types"
)

// uidNamespace is the fixed name-space UUID under which virtual objects'
// uids are derived. Changing it changes every served uid: never do.
var uidNamespace = uuid.MustParse("da7bfa36-8e56-4dd1-b690-18c0db11796e")

const (
	kindImport = "InferencePoolImport"
	kindExport = "InferencePoolExport"
)

// virtualUID derives the uid of a virtual object from what identifies it, so
// that every replica and every restart serves the same uid, and two clusters
// (or two kinds) never share one.
func virtualUID(clusterSet, kind, local, namespace, name string) types.UID {
	key := clusterSet + "/" + kind + "/" + local + "/" + namespace + "/" + name
	return types.UID(uuid.NewSHA1(uidNamespace, []byte(key)).String())
}

// copyLabels copies labels of a cached object: the output must never share a
// map with the informer cache.
func copyLabels(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	return maps.Clone(in)
}
