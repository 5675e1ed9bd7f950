package imports

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// The bounds of an exporter's settings. A weight multiplies the route's
// weight of the cluster, so it is bounded well within int64 products.
const (
	minExportWeight = 1
	maxExportWeight = 1000
	maxExportTags   = 16
)

// exportSettingsJSON is the ExportSettingsAnnotation as written: one JSON
// object, as export-to is, so that one decoder refuses a misspelt field
// (DisallowUnknownFields) and tags, a map, need no syntax of their own.
type exportSettingsJSON struct {
	Weight *int32            `json:"weight,omitempty"`
	Region *string           `json:"region,omitempty"`
	Tags   map[string]string `json:"tags,omitempty"`
}

// parseExportSettings reads a pool's ExportSettingsAnnotation: nil and no
// error when it is absent. Unlike export-to, whose mistake would export
// wider than asked, a mistake here costs importers nothing but the
// settings: the caller serves the export with the defaults (weight 1, no
// region, no tags) and says why (settingsCondition). A route restricted to
// some regions never picks a cluster of no region, so a region misspelt
// keeps that cluster out of such routes rather than in.
func parseExportSettings(annotations map[string]string) (*inference.ExportSettings, error) {
	raw, ok := annotations[v1alpha1.ExportSettingsAnnotation]
	if !ok {
		return nil, nil
	}
	bad := func(format string, a ...any) (*inference.ExportSettings, error) {
		return nil, fmt.Errorf("annotation %q: %s; write it as %s", v1alpha1.ExportSettingsAnnotation, fmt.Sprintf(format, a...), `{"weight": 2, "region": "eu-west-1", "tags": {"slo": "gold"}}`)
	}
	var v exportSettingsJSON
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return bad("not a JSON object with the fields weight, region and tags: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("more than one JSON value")
	}
	if v.Weight == nil && v.Region == nil && v.Tags == nil {
		return bad("it states no setting")
	}
	s := &inference.ExportSettings{Weight: 1, Tags: v.Tags}
	if v.Weight != nil {
		s.Weight = *v.Weight
	}
	if v.Region != nil {
		s.Region = *v.Region
	}
	if err := checkExportSettings(s); err != nil {
		return bad("%v", err)
	}
	return s, nil
}

// checkExportSettings is the one check of settings, an exporter's own or
// those a member's summary carries (which another server wrote: they are
// checked again where they are read).
func checkExportSettings(s *inference.ExportSettings) error {
	if s.Weight < minExportWeight || s.Weight > maxExportWeight {
		return fmt.Errorf("weight %d is not between %d and %d", s.Weight, minExportWeight, maxExportWeight)
	}
	if s.Region != "" {
		if errs := validation.IsDNS1123Label(s.Region); len(errs) > 0 {
			return fmt.Errorf("region %q is not a DNS label: %s", s.Region, strings.Join(errs, "; "))
		}
	}
	if len(s.Tags) > maxExportTags {
		return fmt.Errorf("%d tags, at most %d", len(s.Tags), maxExportTags)
	}
	for k, val := range s.Tags {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("tag key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(val); len(errs) > 0 {
			return fmt.Errorf("tag %q value %q: %s", k, val, strings.Join(errs, "; "))
		}
	}
	return nil
}

// copyExportSettings is s, sharing nothing with it (nil for nil).
func copyExportSettings(s *inference.ExportSettings) *inference.ExportSettings {
	if s == nil {
		return nil
	}
	out := *s
	out.Tags = maps.Clone(s.Tags)
	return &out
}

// settingsVerdict is an export's settings as served, and why they are not
// the exporter's when they could not be read ("" when they could).
type settingsVerdict struct {
	settings *inference.ExportSettings
	problem  string
}

// settings are the export's settings as served in its cluster entry
// (entry: the one summaryEntry or clusterEntry computed). An invalid
// export has none to serve.
func (e exporter) settings(entry inference.InferencePoolExportSummaryStatus) settingsVerdict {
	switch {
	case !e.valid():
		return settingsVerdict{}
	case e.summary != nil:
		return summarySettings(e.member.Name, entry, e.summary.Status.Conditions)
	}
	return poolSettings(e.member.Name, e.pool.Annotations)
}

// poolSettings are the settings a pool states; a cluster's name leads the
// problem, as importers list many clusters.
func poolSettings(cluster string, annotations map[string]string) settingsVerdict {
	s, err := parseExportSettings(annotations)
	if err != nil {
		return settingsVerdict{problem: fmt.Sprintf("cluster %s: %v; its export is served with the default settings (weight 1, no region, no tags)", cluster, err)}
	}
	return settingsVerdict{settings: s}
}

// summarySettings are the settings a member's summary carries: its
// exporter's verdict, checked again, since another server wrote them.
func summarySettings(cluster string, entry inference.InferencePoolExportSummaryStatus, conditions []metav1.Condition) settingsVerdict {
	for _, c := range conditions {
		if c.Type == v1alpha1.ConditionExportSettingsAccepted && c.Status != metav1.ConditionTrue {
			// An empty message would serve no condition at all.
			return settingsVerdict{problem: cmp.Or(c.Message, fmt.Sprintf("cluster %s could not read its own export settings; its export is served with the default settings", cluster))}
		}
	}
	if entry.ExportSettings == nil {
		return settingsVerdict{}
	}
	if err := checkExportSettings(entry.ExportSettings); err != nil {
		return settingsVerdict{problem: fmt.Sprintf("cluster %s published export settings this server cannot read: %v; its export is served with the default settings (weight 1, no region, no tags)", cluster, err)}
	}
	return settingsVerdict{settings: copyExportSettings(entry.ExportSettings)}
}

// condition is the ExportSettingsAccepted condition to serve: nil when
// the settings could be read (present only when they could not).
func (v settingsVerdict) condition(generation int64) *metav1.Condition {
	if v.problem == "" {
		return nil
	}
	c := verdict{reason: v1alpha1.ReasonInvalidExportSettings, message: v.problem}.condition(v1alpha1.ConditionExportSettingsAccepted, generation)
	return &c
}
