package version

import (
	"github.com/spf13/cobra"
)

// AddFlag gives cmd a --version flag that prints "<name> <String()>" and
// exits. Declared here rather than left to cobra, which would add it only
// at execution time and so hide it from the flag reference built from the
// command's flags.
func AddFlag(cmd *cobra.Command) {
	cmd.Version = String()
	cmd.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	cmd.Flags().Bool("version", false, "Print the version of this binary (git description and commit) and exit.")
}
