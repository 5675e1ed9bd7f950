package conformance

import (
	"context"
	"time"
)

// Run runs every test of s, one after the other, passing each to around,
// which must call run exactly once (go test wraps it in t.Run); it returns
// the report of the run.
func (s *Suite) Run(ctx context.Context, around func(tc Test, run func() Result)) *Report {
	start := time.Now()
	var results []Result
	for _, tc := range s.tests {
		if ctx.Err() != nil {
			results = append(results, Result{Name: tc.Name, Requirement: tc.Requirement, Label: tc.Label, Outcome: Skip, Reason: "the run was interrupted: " + ctx.Err().Error()})
			continue
		}
		around(tc, func() Result {
			res := s.RunTest(ctx, tc)
			results = append(results, res)
			return res
		})
	}
	return s.Report(start, results)
}
