package informerhealth

import "k8s.io/apimachinery/pkg/api/meta"

// StripManagedFields is the transform of the sidecar's informers (the
// routing table's and the EPP credentials'): nothing reads managed fields,
// so the caches drop them.
func StripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}
