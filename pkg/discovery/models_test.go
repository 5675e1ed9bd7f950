package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseServedModels(t *testing.T) {
	tests := []struct {
		name    string
		md      map[string]any
		want    *ServedModels
		invalid bool
	}{
		{name: "no model entry says nothing", md: map[string]any{"Transport": map[string]any{}}, want: nil},
		{name: "an empty document says nothing", md: map[string]any{}, want: nil},
		{name: "the seed's Model entry names the base model", md: map[string]any{"Model": map[string]any{"name": "Qwen3-32B", "type": "Completions"}}, want: &ServedModels{Base: "Qwen3-32B"}},
		{name: "the lower-case model entry with adapters, sorted and deduplicated", md: map[string]any{"model": map[string]any{"name": "llama", "lora_adapters": []any{"b", "a", "b"}}}, want: &ServedModels{Base: "llama", Adapters: []string{"a", "b"}}},
		{name: "a null adapter list is none", md: map[string]any{"model": map[string]any{"name": "llama", "lora_adapters": nil}}, want: &ServedModels{Base: "llama"}},
		{name: "both keys are ambiguous", md: map[string]any{"Model": map[string]any{"name": "a"}, "model": map[string]any{"name": "b"}}, invalid: true},
		{name: "a model that is not an object", md: map[string]any{"Model": "llama"}, invalid: true},
		{name: "a model without a name", md: map[string]any{"Model": map[string]any{"type": "Completions"}}, invalid: true},
		{name: "an empty name", md: map[string]any{"Model": map[string]any{"name": ""}}, invalid: true},
		{name: "adapters that are not a list", md: map[string]any{"Model": map[string]any{"name": "a", "lora_adapters": "x"}}, invalid: true},
		{name: "an adapter that is not a string", md: map[string]any{"Model": map[string]any{"name": "a", "lora_adapters": []any{1.0}}}, invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseServedModels(tt.md)
			if tt.invalid {
				require.ErrorIs(t, err, ErrInvalidMetadata)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
