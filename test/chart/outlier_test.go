package chart

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/mci-dev/mci/cmd/mci-sidecar/app"
)

// sidecarOutlierFlags are mci-sidecar's --outlier-* arguments of the chart
// rendered with sets (--set-json).
func sidecarOutlierFlags(t *testing.T, sets ...string) []string {
	t.Helper()
	return sidecarFlags(t, "--outlier-", sets...)
}

// sidecarFlags are mci-sidecar's arguments starting with prefix, of the
// chart rendered with sets (--set-json).
func sidecarFlags(t *testing.T, prefix string, sets ...string) []string {
	t.Helper()
	args := []string{"template", "mci", chartDir, "--namespace", releaseNamespace}
	for _, s := range sets {
		args = append(args, "--set-json", s)
	}
	for _, o := range decode(t, helm(t, args...), "helm template") {
		if o.GetKind() == "Deployment" && o.GetName() == "inference-gateway" {
			inits, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "initContainers")
			require.Len(t, inits, 1)
			all, _, _ := unstructured.NestedStringSlice(inits[0].(map[string]any), "args")
			var out []string
			for _, a := range all {
				if strings.HasPrefix(a, prefix) {
					out = append(out, a)
				}
			}
			return out
		}
	}
	require.Fail(t, "no Deployment inference-gateway")
	return nil
}

// The outlier detection values become mci-sidecar's flags, which it
// accepts; by default none is rendered: the sidecar's defaults hold.
func TestOutlierDetectionValuesBecomeTheSidecarsFlags(t *testing.T) {
	t.Run("none by default", func(t *testing.T) {
		assert.Empty(t, sidecarOutlierFlags(t))
	})
	t.Run("each value set is its flag, and the sidecar takes them", func(t *testing.T) {
		flags := sidecarOutlierFlags(t, `sidecar.outlierDetection={"baseEjectionTime":"10s","maxEjectionTime":"1m","maxEjectionPercent":0,"firstByteFloor":"2s","firstByteCeiling":"0s"}`)
		assert.Equal(t, []string{"--outlier-base-ejection-time=10s", "--outlier-max-ejection-time=1m", "--outlier-max-ejection-percent=0", "--outlier-first-byte-floor=2s", "--outlier-first-byte-ceiling=0s"}, flags)
		o := app.NewOptions()
		require.NoError(t, app.NewCommand(o).Flags().Parse(flags))
		require.NoError(t, o.Outlier.Validate())
		cfg := o.Outlier.Config()
		require.NotNil(t, cfg)
		assert.Equal(t, 10*time.Second, cfg.Detection.BaseEjectionTime)
		assert.Zero(t, cfg.Detection.MaxEjectionPercent)
		assert.Zero(t, cfg.FirstByte.Ceiling)
	})
	t.Run("turned off", func(t *testing.T) {
		assert.Equal(t, []string{"--outlier-detection=false"}, sidecarOutlierFlags(t, `sidecar.outlierDetection.enabled=false`))
	})
	t.Run("an empty object keeps it on", func(t *testing.T) {
		assert.Empty(t, sidecarOutlierFlags(t, `sidecar.outlierDetection={}`))
	})
}

// How long requests in flight keep an EPP that left the routing table is
// the sidecar's own default unless set.
func TestEPPDrainTimeoutValueBecomesTheSidecarsFlag(t *testing.T) {
	assert.Empty(t, sidecarFlags(t, "--epp-drain-timeout"))
	flags := sidecarFlags(t, "--epp-drain-timeout", `sidecar.eppDrainTimeout="30m"`)
	assert.Equal(t, []string{"--epp-drain-timeout=30m"}, flags)
	o := app.NewOptions()
	require.NoError(t, app.NewCommand(o).Flags().Parse(flags))
	assert.Equal(t, 30*time.Minute, o.EPPDrainTimeout)
}
