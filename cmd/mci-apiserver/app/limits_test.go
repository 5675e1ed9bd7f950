package app

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/pkg/clusterset"
)

func TestMemberLimitsMustLetAMemberSendSomething(t *testing.T) {
	assert.Empty(t, validateMemberLimits(clusterset.DefaultLimits), "the defaults are valid")
	small := clusterset.DefaultLimits
	small.Objects, small.ResponseBytes = 0, 1<<20
	errs := validateMemberLimits(small)
	if assert.Len(t, errs, 2) {
		assert.EqualError(t, errs[0], "--member-max-objects must be positive")
		assert.Contains(t, errs[1].Error(), "--member-max-response-bytes must be at least 16 MiB")
	}
}
