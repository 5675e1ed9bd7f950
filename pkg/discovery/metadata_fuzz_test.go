package discovery

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzMetadata decodes /metadata bodies as a model server (or whoever
// answers at its address) sends them, then reads the models they serve:
// errors wrap ErrInvalidMetadata and give nothing; an accepted body is one
// valid JSON document; the models read have a name, and adapters that are
// sorted, unique, non-empty and all listed by the body.
func FuzzMetadata(f *testing.F) {
	for _, s := range []string{
		`{"Model":{"name":"Qwen3-32B","runtime_config":{"total_kv_blocks":24064}}}`,
		`{"model":{"name":"llama","lora_adapters":["b","a","b"]}}`,
		`{"model":{"name":"llama","lora_adapters":null}}`,
		`{"Model":{"name":"a"},"model":{"name":"b"}}`,
		`{"Model":"llama"}`, `{"Model":{"name":""}}`, `{"Model":{"name":1}}`,
		`{"Model":{"name":"a","lora_adapters":"x"}}`, `{"Model":{"name":"a","lora_adapters":[1,""]}}`,
		`{}`, ` {"a":1} ` + "\n", `{"a":1} {"b":2}`, `{"a":1}}`, `{"a":1}]`, `[1,2]`, `null`, `"x"`, ``, `{`,
		"{\"Model\":{\"name\":\"\xff\"}}", `{"a":` + "1e999" + `}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		md, err := decodeMetadata(body)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidMetadata)
			require.Nil(t, md)
			return
		}
		require.NotNil(t, md)
		require.True(t, json.Valid(body), "accepted %q, which is not one JSON document", body)

		models, err := ParseServedModels(md)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidMetadata)
			require.Nil(t, models)
			return
		}
		_, upper := md["Model"]
		_, lower := md["model"]
		if models == nil {
			require.False(t, upper || lower, "a model entry in %q read as none", body)
			return
		}
		require.NotEmpty(t, models.Base)
		require.True(t, slices.IsSorted(models.Adapters))
		require.Len(t, slices.Compact(slices.Clone(models.Adapters)), len(models.Adapters), "duplicate adapters")
		entry := md["Model"]
		if lower {
			entry = md["model"]
		}
		listed, _ := entry.(map[string]any)["lora_adapters"].([]any)
		for _, a := range models.Adapters {
			require.NotEmpty(t, a)
			require.Contains(t, listed, any(a))
		}
		require.Equal(t, models.Base, models.Names()[0])
	})
}
