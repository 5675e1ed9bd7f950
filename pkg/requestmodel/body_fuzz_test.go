package requestmodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzReadBody reads request bodies as a client sends them: whatever the
// body, ReadBody does not panic; what it accepts has a model, which a
// rewrite replaces and nothing else; and the prompt gathered in the same
// walk hashes as promptprefix.Blocks hashes the whole body, so that the
// sidecar's one read of a body picks as two reads did.
func FuzzReadBody(f *testing.F) {
	for _, body := range promptBodies {
		f.Add([]byte(body))
	}
	f.Add([]byte(`{"model":"m","prompt":"hel`))
	f.Add([]byte(`{"mod\u0065l":"m","model":"n"}`))
	f.Add([]byte(`{"prompt\"":"a quote in a key"}`))
	f.Add([]byte(` { } `))
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := ReadBody(body)
		if err == nil {
			require.NotEmpty(t, b.Model())
			again, err := ParseBody(b.WithModel("rewritten"))
			require.NoError(t, err, "a rewritten body is read again")
			assert.Equal(t, "rewritten", again.Model())
		}
		assertSamePrompt(t, body)
	})
}
