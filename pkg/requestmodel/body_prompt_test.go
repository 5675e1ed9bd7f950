package requestmodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// long is more than a prompt block, so that a prompt read otherwise
// hashes otherwise.
const long = "a text longer than one block of the prompt, which is sixty-four bytes"

// promptBodies are request bodies whose prompt the walk for the model
// must read exactly as promptprefix.Blocks reads the whole body.
var promptBodies = []string{
	completion,
	chat,
	`{"model":"m","prompt":["` + long + `",1,{"x":2}]}`,
	`{"model":"m","prompt":null,"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"},{"type":"image_url"}]}]}`,
	`{"model":"m","PROMPT":"keys of the prompt match without regard to case, as encoding/json's"}`,
	`{"model":"m","pro\u006dpt":"an escaped key is the same key, as encoding/json unescapes it"}`,
	`{"model":"m","Meſſages":[{"role":"the long s folds to s","content":"` + long + `"}]}`,
	`{"model":"m","prompt":"` + long + `","prompt":"the last prompt counts, as encoding/json keeps the last value"}`,
	`{"model":"m","messages":[{"role":"system","content":"` + long + `"}],"messages":[{"content":"each messages decodes into the same slice: ` + long + `"}]}`,
	`{"model":"m","messages":[{"role":"a","content":"` + long + `"}],"messages":null,"prompt":"p"}`,
	`{"model":"m","messages":"not an array"}`,
	`{"model":"m","messages":[{"role":7}]}`,
	`{"model":"m","messages":[1]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":7}]}]}`,
	`{"model":"m"}`,
	`{"prompt":"no model, and a prompt still: ` + long + `"}`,
	`{"model":7,"prompt":"a model that is not a string, and a prompt still: ` + long + `"}`,
	`{"model":"","messages":[{"role":"user","content":"an empty model, and a prompt still: ` + long + `"}]}`,
}

func TestReadBodyReadsThePromptAsBlocksDoes(t *testing.T) {
	for _, body := range promptBodies {
		t.Run(body, func(t *testing.T) {
			assertSamePrompt(t, []byte(body))
		})
	}
}

func TestReadBodyReturnsTheBodyWithoutAModelForItsPrompt(t *testing.T) {
	b, err := ReadBody([]byte(`{"prompt":"0123456789012345678901234567890123456789012345678901234567890123"}`))
	require.ErrorIs(t, err, ErrNoModel)
	require.NotNil(t, b)
	assert.Empty(t, b.Model())
	blocks, err := b.Prompt().Blocks(nil, "s")
	require.NoError(t, err)
	assert.Len(t, blocks, 1)

	b, err = ReadBody([]byte(`["prompt"]`))
	require.ErrorIs(t, err, ErrNotJSON)
	assert.Nil(t, b, "a body that is not an object has no members to read")
}

// assertSamePrompt asserts that the prompt ReadBody gathers hashes as
// promptprefix.Blocks hashes the whole body, errors included.
func assertSamePrompt(t *testing.T, body []byte) {
	t.Helper()
	b, _ := ReadBody(body)
	if b == nil {
		return
	}
	want, wantErr := promptprefix.Blocks(nil, "s", body)
	got, gotErr := b.Prompt().Blocks(nil, "s")
	assert.Equal(t, want, got)
	assert.Equal(t, wantErr == nil, gotErr == nil, "Blocks: %v, Prompt.Blocks: %v", wantErr, gotErr)
	if wantErr != nil {
		assert.Equal(t, wantErr.Error() == promptprefix.ErrNoPrompt.Error(), gotErr.Error() == promptprefix.ErrNoPrompt.Error())
	}
}
