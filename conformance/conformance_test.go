package conformance

import (
	"context"
	"flag"
	"testing"
)

// The suite's flags, given after -args: go test ./conformance -args
// --contexts=a,b,c --report-dir=out.
var config Config

func init() { config.AddFlags(flag.CommandLine) }

// TestConformance runs the suite against the clusters of --contexts, each
// test as a subtest, and writes the report into --report-dir.
func TestConformance(t *testing.T) {
	if len(config.Contexts) == 0 {
		t.Skip("no clusters to test: go test ./conformance -args --contexts=a,b,c (docs/conformance.md)")
	}
	ctx := context.Background()
	suite, err := NewSuite(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	report := suite.Run(ctx, func(tc Test, run func() Result) {
		t.Run(tc.Name, func(t *testing.T) {
			res := run()
			t.Logf("%s: %s", tc.Label, tc.Requirement)
			switch res.Outcome {
			case Fail:
				t.Error(res.Reason)
			case Skip:
				t.Skip(res.Reason)
			}
		})
	})
	if config.ReportDir != "" {
		if err := report.Write(config.ReportDir); err != nil {
			t.Error(err)
		}
		t.Logf("report written to %s", config.ReportDir)
	}
}
