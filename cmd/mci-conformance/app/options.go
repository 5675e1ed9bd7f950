// Package app is the mci-conformance command: flags, then a run of the
// conformance suite and its report.
package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/mci-dev/mci/conformance"
	"github.com/mci-dev/mci/pkg/version"
)

// Options are the suite's configuration.
type Options struct {
	conformance.Config
	// Out receives the progress lines and the summary.
	Out io.Writer
}

// NewOptions are the defaults: the report in the working directory.
func NewOptions() *Options {
	return &Options{Config: conformance.Config{PollTimeout: conformance.DefaultPollTimeout, ReportDir: "."}, Out: os.Stdout}
}

// NewCommand is the mci-conformance command.
func NewCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mci-conformance",
		Short: "Conformance suite for InferencePoolImport: runs against the clusters of a kubeconfig and writes report.yaml and report.html",
		Long: `mci-conformance checks an implementation of multi-cluster InferencePools
(the export annotation and InferencePoolImport, inference.networking.x-k8s.io/v1alpha1)
against the clusters named by --contexts, at least 2 (3 for the tests that need a
bystander). It creates objects only in namespaces of its own (mci-conformance-<random>),
deletes them afterwards, and writes report.yaml and report.html into --report-dir.
It exits 1 when a test fails. docs/conformance.md says what each test checks.

  mci-conformance --kubeconfig ~/.kube/config --contexts=kind-a,kind-b,kind-c --report-dir=out`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.Run(cmd.Context())
		},
	}
	goFlags := flag.NewFlagSet("mci-conformance", flag.ContinueOnError)
	o.AddFlags(goFlags)
	cmd.Flags().AddGoFlagSet(goFlags)
	version.AddFlag(cmd)
	return cmd
}

// Run runs the suite and writes the report; an error when a test failed.
func (o *Options) Run(ctx context.Context) error {
	suite, err := conformance.NewSuite(ctx, o.Config)
	if err != nil {
		return err
	}
	tests := suite.Tests()
	i := 0
	report := suite.Run(ctx, func(tc conformance.Test, run func() conformance.Result) {
		i++
		fmt.Fprintf(o.Out, "[%d/%d] %-8s %s ... ", i, len(tests), tc.Label, tc.Name)
		res := run()
		fmt.Fprintf(o.Out, "%s (%.1fs)\n", res.Outcome, res.Seconds)
		if res.Reason != "" {
			fmt.Fprintf(o.Out, "    %s\n", res.Reason)
		}
	})
	for _, l := range report.Labels() {
		c := report.Summary[l]
		fmt.Fprintf(o.Out, "%-8s pass %d, fail %d, skip %d\n", l, c.Pass, c.Fail, c.Skip)
	}
	if o.ReportDir != "" {
		if err := report.Write(o.ReportDir); err != nil {
			return err
		}
		fmt.Fprintf(o.Out, "report: %s/report.yaml, %s/report.html\n", o.ReportDir, o.ReportDir)
	}
	if !report.Passed() {
		return fmt.Errorf("conformance tests failed against %s", report.Implementation.Name)
	}
	return nil
}
