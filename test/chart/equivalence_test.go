package chart

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The chart and the kustomize bases of artifacts/deploy render the same
// objects for the same settings: the same kinds, names and namespaces, each
// with equal content (lists that are sets compared as sets). The settings
// are testdata/kustomize-equivalent.yaml plus each case's.
func TestChartRendersWhatTheKustomizeBasesRender(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sets  []string
		bases []string
	}{{
		name:  "self-signed serving certificate, sidecar",
		bases: []string{"mci-apiserver", "mci-sidecar"},
	}, {
		name:  "cert-manager serving certificate, sidecar",
		sets:  []string{"apiserver.tls.mode=certManager"},
		bases: []string{"mci-apiserver-cert-manager", "mci-sidecar"},
	}, {
		name:  "self-signed serving certificate, sidecar, mci-epp",
		sets:  []string{"epp.enabled=true"},
		bases: []string{"mci-apiserver", "mci-sidecar", "mci-epp"},
	}, {
		name:  "mci-apiserver alone",
		sets:  []string{"sidecar.enabled=false"},
		bases: []string{"mci-apiserver"},
	}, {
		name:  "mci-epp alone",
		sets:  []string{"apiserver.enabled=false", "sidecar.enabled=false", "createNamespace=false", "epp.enabled=true"},
		bases: []string{"mci-epp"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			chart := byKey(t, helmTemplate(t, tc.sets...), "the chart")
			bases := byKey(t, kustomize(t, tc.bases...), "the kustomize bases")
			if !assert.ElementsMatch(t, slices.Sorted(maps.Keys(bases)), slices.Sorted(maps.Keys(chart)), "the objects rendered (kustomize first, the chart second)") {
				return
			}
			for k, want := range bases {
				assert.Equal(t, want, chart[k], "%s (kustomize expected, the chart actual)", k)
			}
		})
	}
}
