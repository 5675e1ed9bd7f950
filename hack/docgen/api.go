package docgen

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/generated/openapi"
)

// refPrefix is what the reference callback puts before a model name, so
// that a field's type can be read back from its schema.
const refPrefix = "#/definitions/"

// servedKinds are the top-level resources of the API group, listed first.
var servedKinds = []string{"InferencePoolImport", "InferencePoolExport"}

// APIReference renders docs/reference/api.md from the OpenAPI definitions
// that hack/update-codegen.sh generates from pkg/apis: every type of the
// served group version, its fields, their types and whether they are
// required, in the words of the types' own comments.
func APIReference() ([]byte, error) {
	defs := openapi.GetOpenAPIDefinitions(func(name string) spec.Ref {
		return spec.MustCreateRef(refPrefix + name)
	})
	prefix := modelPrefix()
	types := map[string]common.OpenAPIDefinition{}
	for name, def := range defs {
		if short, ok := strings.CutPrefix(name, prefix); ok {
			types[short] = def
		}
	}
	if len(types) == 0 {
		return nil, fmt.Errorf("no OpenAPI definitions under %s", prefix)
	}
	var b bytes.Buffer
	b.WriteString(generatedHeader("hack/update-docs.sh", "the OpenAPI definitions generated from pkg/apis/inference/v1alpha1"))
	fmt.Fprintf(&b, "# API reference: %s\n\n", v1alpha1.SchemeGroupVersion)
	b.WriteString("mci-apiserver serves these resources, read-only, in every member cluster\n")
	b.WriteString("(see [the API page](../api.md) for what they mean and how to read them).\n")
	b.WriteString("Fields are listed as they appear in JSON; `*` marks a required field.\n")
	for _, name := range typeOrder(types) {
		writeType(&b, name, types[name].Schema, prefix)
	}
	return b.Bytes(), nil
}

// modelPrefix is the OpenAPI model name of the group version, before the
// type name.
func modelPrefix() string {
	name := v1alpha1.InferencePoolImport{}.OpenAPIModelName()
	return strings.TrimSuffix(name, "InferencePoolImport")
}

// typeOrder puts the served kinds first, then every other type by name.
func typeOrder(types map[string]common.OpenAPIDefinition) []string {
	var rest []string
	first := map[string]bool{}
	for _, k := range servedKinds {
		first[k] = true
	}
	for name := range types {
		if !first[name] {
			rest = append(rest, name)
		}
	}
	sort.Strings(rest)
	var order []string
	for _, k := range servedKinds {
		if _, ok := types[k]; ok {
			order = append(order, k)
		}
	}
	return append(order, rest...)
}

func writeType(b *bytes.Buffer, name string, s spec.Schema, prefix string) {
	fmt.Fprintf(b, "\n## %s\n\n", name)
	if s.Description != "" {
		fmt.Fprintf(b, "%s\n\n", oneParagraph(s.Description))
	}
	if len(s.Properties) == 0 {
		b.WriteString("No fields.\n")
		return
	}
	required := map[string]bool{}
	for _, r := range s.Required {
		required[r] = true
	}
	fields := make([]string, 0, len(s.Properties))
	for f := range s.Properties {
		fields = append(fields, f)
	}
	sort.Strings(fields)
	b.WriteString("| field | type | description |\n|---|---|---|\n")
	for _, f := range fields {
		p := s.Properties[f]
		field := "`" + f + "`"
		if required[f] {
			field += " *"
		}
		desc := p.Description
		if len(p.Enum) > 0 {
			desc = strings.TrimSpace(desc + " One of: " + enumValues(p.Enum) + ".")
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", field, typeName(p, prefix), cell(desc))
	}
}

// typeName says what a property holds: a scalar type, a link to another
// type of the group, or the model name of an outside type.
func typeName(s spec.Schema, prefix string) string {
	if ref := s.Ref.String(); ref != "" {
		model := strings.TrimPrefix(ref, refPrefix)
		if short, ok := strings.CutPrefix(model, prefix); ok {
			return fmt.Sprintf("[%s](#%s)", short, strings.ToLower(short))
		}
		return "`" + model + "`"
	}
	if len(s.Type) == 0 {
		return ""
	}
	switch s.Type[0] {
	case "array":
		if s.Items != nil && s.Items.Schema != nil {
			return typeName(*s.Items.Schema, prefix) + " array"
		}
	case "object":
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			return "map of " + typeName(*s.AdditionalProperties.Schema, prefix)
		}
	}
	if s.Format != "" {
		return s.Type[0] + " (" + s.Format + ")"
	}
	return s.Type[0]
}

func enumValues(values []interface{}) string {
	out := make([]string, 0, len(values))
	for _, v := range values {
		out = append(out, fmt.Sprintf("`%v`", v))
	}
	return strings.Join(out, ", ")
}

// oneParagraph joins a type comment's lines, since the generator keeps
// the comment's line breaks.
func oneParagraph(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
