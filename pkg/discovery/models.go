package discovery

import (
	"errors"
	"fmt"
	"slices"
)

// ServedModels is what an instance's metadata says it serves: seed 002's
// "Model" entry (the key is "Model" in the seed's set_metadata example and
// "model" in its first one; both are read), its "name" the base model and
// its "lora_adapters" (vLLM's name for them) the LoRA adapters it can load.
type ServedModels struct {
	// Base is the base model's name.
	Base string
	// Adapters are the LoRA adapters, sorted, without duplicates.
	Adapters []string
}

// Names returns every model name the instance answers to: the base model
// and its adapters.
func (m ServedModels) Names() []string { return append([]string{m.Base}, m.Adapters...) }

// ErrInvalidMetadata means a /metadata document has a model entry that is
// not of the seed's shape.
var ErrInvalidMetadata = errors.New("invalid model metadata")

// ParseServedModels reads the models an instance serves from its metadata.
// It returns nil and no error when the metadata has no model entry: the
// instance says nothing about its models. A model entry that is not an
// object with a non-empty string "name", or whose "lora_adapters" is not a
// list of non-empty strings, is an error wrapping ErrInvalidMetadata.
func ParseServedModels(md map[string]any) (*ServedModels, error) {
	key := "Model"
	entry, ok := md[key]
	if _, lower := md["model"]; lower {
		if ok {
			return nil, fmt.Errorf("%w: both \"Model\" and \"model\" are set", ErrInvalidMetadata)
		}
		key = "model"
		entry = md[key]
	} else if !ok {
		return nil, nil
	}
	obj, ok := entry.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: %q is a %T, not an object", ErrInvalidMetadata, key, entry)
	}
	name, ok := obj["name"].(string)
	if !ok || name == "" {
		return nil, fmt.Errorf("%w: %s.name must be a non-empty string, got %#v", ErrInvalidMetadata, key, obj["name"])
	}
	out := &ServedModels{Base: name}
	if raw, present := obj["lora_adapters"]; present && raw != nil {
		list, ok := raw.([]any)
		if !ok {
			return nil, fmt.Errorf("%w: %s.lora_adapters is a %T, not a list", ErrInvalidMetadata, key, raw)
		}
		for i, a := range list {
			s, ok := a.(string)
			if !ok || s == "" {
				return nil, fmt.Errorf("%w: %s.lora_adapters[%d] must be a non-empty string, got %#v", ErrInvalidMetadata, key, i, a)
			}
			out.Adapters = append(out.Adapters, s)
		}
		slices.Sort(out.Adapters)
		out.Adapters = slices.Compact(out.Adapters)
	}
	return out, nil
}
