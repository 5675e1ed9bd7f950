// Package docgen renders the generated pages of docs/reference: the flag
// reference of every mci binary, read from the flag sets their commands
// register, and the API reference of the served API group, read from the
// OpenAPI definitions generated from pkg/apis. hack/update-docs.sh writes
// them; test/docs and hack/verify-docs.sh fail when they are stale.
package docgen

import "fmt"

// Dir is where the generated pages live, relative to the repository root.
const Dir = "docs/reference"

// Pages returns every generated page by its path relative to the
// repository root. The flag defaults that come from the environment
// (POD_NAMESPACE) are rendered as the environment says: callers clear it
// first so that the pages do not depend on where they are generated.
func Pages() (map[string][]byte, error) {
	flags, err := FlagReference()
	if err != nil {
		return nil, fmt.Errorf("flag reference: %w", err)
	}
	api, err := APIReference()
	if err != nil {
		return nil, fmt.Errorf("API reference: %w", err)
	}
	return map[string][]byte{
		Dir + "/flags.md": flags,
		Dir + "/api.md":   api,
	}, nil
}
