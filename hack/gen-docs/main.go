// Command gen-docs writes the generated pages of docs/reference (the flag
// and API references, see hack/docgen) under a repository root. Run it
// through hack/update-docs.sh.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mci-dev/mci/hack/docgen"
)

func main() {
	root := flag.String("root", ".", "Repository root (or a scratch copy of it) to write docs/reference under.")
	flag.Parse()
	if err := write(*root); err != nil {
		fmt.Fprintln(os.Stderr, "gen-docs:", err)
		os.Exit(1)
	}
}

func write(root string) error {
	// The defaults of --namespace and --pool-namespace come from
	// POD_NAMESPACE; the reference shows those of an unset one.
	if err := os.Unsetenv("POD_NAMESPACE"); err != nil {
		return err
	}
	pages, err := docgen.Pages()
	if err != nil {
		return err
	}
	for path, content := range pages {
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, content, 0o644); err != nil {
			return err
		}
	}
	return nil
}
