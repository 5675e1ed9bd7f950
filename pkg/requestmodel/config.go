package requestmodel

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
)

// The kinds a model configuration file holds.
const (
	kindModel     = "InferenceModel"
	kindObjective = "InferenceObjective"
	kindRewrite   = "InferenceModelRewrite"
)

// LoadModelConfig reads a YAML stream of InferenceModel,
// InferenceObjective and InferenceModelRewrite objects, documents separated
// by "---": InferenceModel in inference.networking.x-k8s.io/v1alpha2 (as
// seed 001 writes it), the other two in that group (GIE up to v1.5) or in
// llm-d.ai/v1alpha2 (GIE v1.6 on). Unknown fields are errors, so that a typo
// does not silently drop a setting, and so are the things the CRDs'
// validation would refuse and a name defined twice for one kind and group.
// Errors name the document (counting from 1) and the object.
func LoadModelConfig(r io.Reader) (ModelConfig, error) {
	reader := yamlutil.NewYAMLReader(bufio.NewReader(r))
	var c ModelConfig
	names := map[string]int{}
	for doc := 1; ; doc++ {
		data, err := reader.Read()
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return ModelConfig{}, fmt.Errorf("document %d: %w", doc, err)
		}
		if isEmptyDocument(data) {
			doc--
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(data, &head); err != nil {
			return ModelConfig{}, fmt.Errorf("document %d: %w", doc, err)
		}
		what := fmt.Sprintf("document %d (%s %q)", doc, head.Kind, head.Metadata.Name)
		x, llmd := v1alpha2.SchemeGroupVersion.String(), llmdv1alpha2.SchemeGroupVersion.String()
		switch {
		case head.APIVersion == x && head.Kind == kindModel:
			im := &v1alpha2.InferenceModel{}
			err = decode(data, im, func() error { return validateModel(im) })
			c.Models = append(c.Models, im)
		case head.APIVersion == x && head.Kind == kindObjective:
			o := &v1alpha2.InferenceObjective{}
			err = decode(data, o, func() error { return validateObjective(o.Name, &o.Spec) })
			c.Objectives = append(c.Objectives, o)
		case head.APIVersion == llmd && head.Kind == kindObjective:
			o := &llmdv1alpha2.InferenceObjective{}
			err = decode(data, o, func() error { return validateObjective(o.Name, &o.Spec) })
			c.Objectives = append(c.Objectives, ObjectiveFromLLMD(o))
		case head.APIVersion == x && head.Kind == kindRewrite:
			rw := &v1alpha2.InferenceModelRewrite{}
			err = decode(data, rw, func() error { return validateRewrite(rw.Name, &rw.Spec) })
			c.Rewrites = append(c.Rewrites, rw)
		case head.APIVersion == llmd && head.Kind == kindRewrite:
			rw := &llmdv1alpha2.InferenceModelRewrite{}
			err = decode(data, rw, func() error { return validateRewrite(rw.Name, &rw.Spec) })
			c.Rewrites = append(c.Rewrites, RewriteFromLLMD(rw))
		default:
			return ModelConfig{}, fmt.Errorf("document %d: apiVersion %q, kind %q: want %s %s, or %s or %s in %s or %s",
				doc, head.APIVersion, head.Kind, x, kindModel, kindObjective, kindRewrite, x, llmd)
		}
		if err != nil {
			return ModelConfig{}, fmt.Errorf("%s: %w", what, err)
		}
		key := head.APIVersion + " " + head.Kind + " " + head.Metadata.Name
		if prev, ok := names[key]; ok {
			return ModelConfig{}, fmt.Errorf("%s: %s %q of %s is already defined in document %d", what, head.Kind, head.Metadata.Name, head.APIVersion, prev)
		}
		names[key] = doc
	}
}

// decode unmarshals data strictly into obj and validates it.
func decode(data []byte, obj any, validate func() error) error {
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		return err
	}
	return validate()
}

// isEmptyDocument reports a document of only comments and blank lines.
func isEmptyDocument(data []byte) bool {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

// validateModel checks what the InferenceModel CRD's schema checks.
func validateModel(im *v1alpha2.InferenceModel) error {
	var errs []error
	if im.Name == "" {
		errs = append(errs, errors.New("metadata.name is required"))
	}
	switch n := len(im.Spec.ModelName); {
	case n == 0:
		errs = append(errs, errors.New("spec.modelName is required"))
	case n > 256:
		errs = append(errs, fmt.Errorf("spec.modelName is %d characters, at most 256", n))
	}
	if c := im.Spec.Criticality; c != nil && *c != v1alpha2.Critical && *c != v1alpha2.Standard && *c != v1alpha2.Sheddable {
		errs = append(errs, fmt.Errorf("spec.criticality %q: want Critical, Standard or Sheddable", *c))
	}
	if len(im.Spec.TargetModels) > 10 {
		errs = append(errs, fmt.Errorf("spec.targetModels has %d entries, at most 10", len(im.Spec.TargetModels)))
	}
	weighted := 0
	for i, t := range im.Spec.TargetModels {
		if t.Name == "" {
			errs = append(errs, fmt.Errorf("spec.targetModels[%d].name is required", i))
		}
		if t.Weight != nil {
			weighted++
			if *t.Weight < 1 || *t.Weight > 1000000 {
				errs = append(errs, fmt.Errorf("spec.targetModels[%d].weight %d: want 1 to 1000000", i, *t.Weight))
			}
		}
	}
	if weighted != 0 && weighted != len(im.Spec.TargetModels) {
		errs = append(errs, errors.New("spec.targetModels: set a weight on every target or on none"))
	}
	return errors.Join(errs...)
}

// validateObjective checks what the InferenceObjective CRD's schema checks.
func validateObjective(name string, spec *v1alpha2.InferenceObjectiveSpec) error {
	var errs []error
	if name == "" {
		errs = append(errs, errors.New("metadata.name is required"))
	}
	if spec.PoolRef.Name == "" {
		errs = append(errs, errors.New("spec.poolRef.name is required"))
	}
	return errors.Join(errs...)
}

// validateRewrite checks what the InferenceModelRewrite CRD's schema checks,
// and that a rule's targets have weights on all or none, as the API asks.
func validateRewrite(name string, spec *v1alpha2.InferenceModelRewriteSpec) error {
	var errs []error
	if name == "" {
		errs = append(errs, errors.New("metadata.name is required"))
	}
	if spec.PoolRef == nil || spec.PoolRef.Name == "" {
		errs = append(errs, errors.New("spec.poolRef.name is required"))
	}
	if spec.Rules == nil {
		errs = append(errs, errors.New("spec.rules is required"))
	}
	for i, r := range spec.Rules {
		for j, m := range r.Matches {
			switch {
			case m.Model == nil:
				errs = append(errs, fmt.Errorf("spec.rules[%d].matches[%d].model is required", i, j))
			case m.Model.Value == "":
				errs = append(errs, fmt.Errorf("spec.rules[%d].matches[%d].model.value is required", i, j))
			case m.Model.Type != nil && *m.Model.Type != v1alpha2.MatchExact:
				errs = append(errs, fmt.Errorf("spec.rules[%d].matches[%d].model.type %q: want Exact", i, j, *m.Model.Type))
			}
		}
		if r.Targets != nil && len(r.Targets) == 0 {
			errs = append(errs, fmt.Errorf("spec.rules[%d].targets: at least 1 target when present", i))
		}
		weighted := 0
		for j, t := range r.Targets {
			if t.ModelRewrite == "" {
				errs = append(errs, fmt.Errorf("spec.rules[%d].targets[%d].modelRewrite is required", i, j))
			}
			if t.Weight != nil {
				weighted++
				if *t.Weight < 1 || *t.Weight > 1000000 {
					errs = append(errs, fmt.Errorf("spec.rules[%d].targets[%d].weight %d: want 1 to 1000000", i, j, *t.Weight))
				}
			}
		}
		if weighted != 0 && weighted != len(r.Targets) {
			errs = append(errs, fmt.Errorf("spec.rules[%d].targets: set a weight on every target or on none", i))
		}
	}
	return errors.Join(errs...)
}
