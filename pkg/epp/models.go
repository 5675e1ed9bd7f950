package epp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"

	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Model is what the EPP does with the requests for one model name, from an
// InferenceModel: how critical they are and which model they are rewritten
// to.
type Model struct {
	// Name is the model name requests carry (spec.modelName).
	Name string
	// Criticality of its requests.
	Criticality scheduling.Criticality
	// Source is the InferenceModel it comes from, "namespace/name".
	Source string
	// targets are the target model names, cum their cumulative weights.
	targets []string
	cum     []int64
}

// Targets returns the target model names, in the InferenceModel's order.
func (m *Model) Targets() []string { return slices.Clone(m.targets) }

// TargetModel picks the model a request is rewritten to, with the
// InferenceModel's weights; r supplies the randomness. A model without
// targets is its own target.
func (m *Model) TargetModel(r *rand.Rand) string {
	switch len(m.targets) {
	case 0:
		return m.Name
	case 1:
		return m.targets[0]
	}
	n := r.Int64N(m.cum[len(m.cum)-1])
	i, _ := slices.BinarySearch(m.cum, n+1)
	return m.targets[i]
}

// newModel resolves an InferenceModel. A target without a weight weighs 1
// (the API's documented default); when every weight is 0, which validation
// forbids but a hand-written file may hold, the targets share equally.
func newModel(im *v1alpha2.InferenceModel) *Model {
	m := &Model{Name: im.Spec.ModelName, Criticality: criticality(im.Spec.Criticality), Source: im.Namespace + "/" + im.Name}
	var total int64
	for _, t := range im.Spec.TargetModels {
		w := int64(1)
		if t.Weight != nil {
			w = max(int64(*t.Weight), 0)
		}
		if w == 0 {
			continue
		}
		total += w
		m.targets = append(m.targets, t.Name)
		m.cum = append(m.cum, total)
	}
	if total == 0 && len(im.Spec.TargetModels) > 0 {
		for i, t := range im.Spec.TargetModels {
			m.targets = append(m.targets, t.Name)
			m.cum = append(m.cum, int64(i+1))
		}
	}
	return m
}

// criticality maps the API's criticality; absent means Standard, the API's
// default.
func criticality(c *v1alpha2.Criticality) scheduling.Criticality {
	if c == nil {
		return scheduling.Standard
	}
	switch *c {
	case v1alpha2.Critical:
		return scheduling.Critical
	case v1alpha2.Sheddable:
		return scheduling.Sheddable
	default:
		return scheduling.Standard
	}
}

// Models holds the InferenceModels of a pool by model name. Reads are
// lock-free; Set swaps in a new map. Safe for concurrent use.
type Models struct {
	byName atomic.Pointer[map[string]*Model]
}

// NewModels returns an empty set.
func NewModels() *Models {
	s := &Models{}
	s.byName.Store(&map[string]*Model{})
	return s
}

// Set replaces the models. When several InferenceModels claim one model
// name, the oldest (creationTimestamp, then namespace/name) wins, as
// upstream's conflict rule says; Set returns the ones it ignored so that the
// caller can report them.
func (s *Models) Set(objs []*v1alpha2.InferenceModel) (ignored []string) {
	sorted := slices.Clone(objs)
	slices.SortStableFunc(sorted, func(a, b *v1alpha2.InferenceModel) int {
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	byName := make(map[string]*Model, len(sorted))
	for _, im := range sorted {
		if old, ok := byName[im.Spec.ModelName]; ok {
			ignored = append(ignored, fmt.Sprintf("%s/%s (model %q is already served by the older %s)", im.Namespace, im.Name, im.Spec.ModelName, old.Source))
			continue
		}
		byName[im.Spec.ModelName] = newModel(im)
	}
	s.byName.Store(&byName)
	return ignored
}

// Get returns the model for a name, nil when no InferenceModel has it.
func (s *Models) Get(name string) *Model {
	return (*s.byName.Load())[name]
}

// Len returns how many model names are known.
func (s *Models) Len() int {
	return len(*s.byName.Load())
}

// LoadModels reads a YAML stream of InferenceModel objects
// (inference.networking.x-k8s.io/v1alpha2, as seed 001 writes them),
// documents separated by "---". Unknown fields are errors, so that a typo
// does not silently drop a setting, and so are the things the CRD's
// validation would refuse. Errors name the document (counting from 1).
func LoadModels(r io.Reader) ([]*v1alpha2.InferenceModel, error) {
	reader := yamlutil.NewYAMLReader(bufio.NewReader(r))
	var models []*v1alpha2.InferenceModel
	names := map[string]int{}
	for doc := 1; ; doc++ {
		data, err := reader.Read()
		if err == io.EOF {
			return models, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if isEmptyDocument(data) {
			doc--
			continue
		}
		im := &v1alpha2.InferenceModel{}
		if err := yaml.UnmarshalStrict(data, im); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if gv := v1alpha2.SchemeGroupVersion.String(); im.APIVersion != gv || im.Kind != "InferenceModel" {
			return nil, fmt.Errorf("document %d: apiVersion %q, kind %q: want apiVersion %s, kind InferenceModel", doc, im.APIVersion, im.Kind, gv)
		}
		if err := validateModel(im); err != nil {
			return nil, fmt.Errorf("document %d (InferenceModel %q): %w", doc, im.Name, err)
		}
		key := im.Namespace + "/" + im.Name
		if prev, ok := names[key]; ok {
			return nil, fmt.Errorf("document %d: InferenceModel %q is already defined in document %d", doc, im.Name, prev)
		}
		names[key] = doc
		models = append(models, im)
	}
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
