package clusterset

import (
	"maps"

	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/imports"
)

// A member is drained as a whole, ahead of its cluster's maintenance, by
// the drain annotation (v1alpha1.DrainAnnotation) on the Secret or
// ClusterProfile that names it: every export of that cluster is then
// flagged Draining in the imports this server computes, as if each of its
// pools carried the annotation, while they stay Ready and served. Only
// servers whose membership says so see it: with member Secrets, the Secret
// in each importing cluster; with ClusterProfiles, the one profile every
// importer reads.
//
// A value other than "true" or "false" is reported (a log line when it
// changes, mci_clusterset_member_drain_invalid) and does not drain: unlike
// a pool's misspelt drain, which makes that one export invalid, a member's
// would take a whole cluster's capacity away on a typo.

// memberMeta is what a member's Secret or ClusterProfile says of it beside
// its connection.
type memberMeta struct {
	labels map[string]string
	// drain is the value of its drain annotation, "" for none.
	drain string
}

func (m memberMeta) equal(o memberMeta) bool {
	return m.drain == o.drain && maps.Equal(m.labels, o.labels)
}

// draining says whether the member drains; err when its annotation has a
// value that is neither "true" nor "false" (it then does not drain).
func (m memberMeta) draining() (bool, error) {
	if m.drain == "" {
		return false, nil
	}
	return imports.Draining(map[string]string{v1alpha1.DrainAnnotation: m.drain})
}

// logDrainChange says, once per change, that a member started or stopped
// draining, or that its drain annotation is ignored.
func logDrainChange(name string, prev, next memberMeta) {
	if prev.drain == next.drain {
		return
	}
	was, _ := prev.draining()
	is, err := next.draining()
	switch {
	case err != nil:
		klog.ErrorS(err, "Ignoring the drain annotation of the member's Secret or ClusterProfile: the member does not drain", "member", name)
	case is && !was:
		klog.InfoS("Member drains: its exports are flagged Draining in imports, and sidecars send its cluster no new requests", "member", name)
	case was && !is:
		klog.InfoS("Member no longer drains", "member", name)
	}
}
