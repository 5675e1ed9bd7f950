package conformance

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
)

// Label says how much of a claim a test backs.
type Label string

const (
	// Required tests check the upstream contract: the export annotation,
	// InferencePoolImport in the shape of the Gateway API Inference
	// Extension's apix/v1alpha1, the Exported condition on the exporter.
	// Every implementation must pass them.
	Required Label = "Required"
	// Optional tests check the proposal's richer surface
	// (status.clusters[], routing modes, InferencePoolExport, ...): an
	// implementation that offers the feature must pass them.
	Optional Label = "Optional"
	// Extended tests need a data path (a Gateway and a model server in the
	// clusters) and are skipped, with the reason, where there is none.
	Extended Label = "Extended"
)

func (l Label) valid() bool { return l == Required || l == Optional || l == Extended }

// Test is one check of the suite.
type Test struct {
	// Name reads as a sentence about the behaviour.
	Name string
	// Requirement names what is checked: the proposal's section or the
	// upstream field's doc, quoted or paraphrased.
	Requirement string
	Label       Label
	// Clusters is how many clusters the test needs (2 when 0).
	Clusters int
	Run      func(t *T)
}

// Outcome is what a test came to.
type Outcome string

const (
	Pass Outcome = "pass"
	Fail Outcome = "fail"
	Skip Outcome = "skip"
)

// Result is one test's outcome.
type Result struct {
	Name        string        `json:"name"`
	Requirement string        `json:"requirement"`
	Label       Label         `json:"label"`
	Outcome     Outcome       `json:"outcome"`
	Reason      string        `json:"reason,omitempty"`
	Duration    time.Duration `json:"-"`
	Seconds     float64       `json:"seconds"`
}

// T is what a test gets: its clusters, a context, and the means to fail or
// skip, shaped as testing.T so that testify's assert and require work with
// it. FailNow and SkipNow end the test's goroutine, as testing's do.
type T struct {
	ctx    context.Context
	suite  *Suite
	mu     sync.Mutex
	failed bool
	skip   string
	msgs   []string
	clean  []func()
}

// Context is cancelled when the suite is interrupted.
func (t *T) Context() context.Context { return t.ctx }

// Clusters are the clusters under test, in the order of --contexts.
func (t *T) Clusters() []*Cluster { return t.suite.clusters }

// PollTimeout bounds every wait for a change.
func (t *T) PollTimeout() time.Duration { return t.suite.cfg.PollTimeout }

func (t *T) Helper() {}

func (t *T) Logf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.msgs = append(t.msgs, "log: "+fmt.Sprintf(format, args...))
}

func (t *T) Errorf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
	t.msgs = append(t.msgs, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

func (t *T) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	t.FailNow()
}

func (t *T) FailNow() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	runtime.Goexit()
}

// Skipf ends the test as skipped, with the reason the report shows.
func (t *T) Skipf(format string, args ...any) {
	t.mu.Lock()
	t.skip = fmt.Sprintf(format, args...)
	t.mu.Unlock()
	runtime.Goexit()
}

// Cleanup registers f to run after the test, last registered first.
func (t *T) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.clean = append(t.clean, f)
}

// Suite runs the tests against a set of clusters.
type Suite struct {
	cfg      Config
	clusters []*Cluster
	tests    []Test

	mu          sync.Mutex
	controllers map[string]bool
}

// NewSuite connects to the clusters cfg names.
func NewSuite(ctx context.Context, cfg Config) (*Suite, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	clusters, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &Suite{cfg: cfg, clusters: clusters, controllers: map[string]bool{}}
	var run *regexp.Regexp
	if cfg.Run != "" {
		run = regexp.MustCompile(cfg.Run)
	}
	for _, tc := range AllTests() {
		if run != nil && !run.MatchString(tc.Name) {
			continue
		}
		if len(cfg.Labels) > 0 && !slices.Contains(cfg.Labels, string(tc.Label)) {
			continue
		}
		s.tests = append(s.tests, tc)
	}
	return s, nil
}

// Tests are the tests the suite runs, after --run and --labels.
func (s *Suite) Tests() []Test { return s.tests }

// RunTest runs one test to its end, cleanups included, and never panics.
func (s *Suite) RunTest(ctx context.Context, tc Test) (res Result) {
	res = Result{Name: tc.Name, Requirement: tc.Requirement, Label: tc.Label}
	start := time.Now()
	defer func() {
		res.Duration = time.Since(start)
		res.Seconds = res.Duration.Round(10 * time.Millisecond).Seconds()
	}()
	need := max(tc.Clusters, 2)
	if len(s.clusters) < need {
		res.Outcome, res.Reason = Skip, fmt.Sprintf("needs %d clusters, --contexts names %d", need, len(s.clusters))
		return res
	}
	t := &T{ctx: ctx, suite: s}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		tc.Run(t)
	}()
	<-done
	// Each cleanup runs in a goroutine of its own, where a FailNow ends
	// that cleanup only.
	for i := len(t.clean) - 1; i >= 0; i-- {
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("panic in cleanup: %v", r)
				}
			}()
			t.clean[i]()
		}()
		<-done
	}
	var msgs []string
	for _, m := range t.msgs {
		if !strings.HasPrefix(m, "log: ") || t.failed {
			msgs = append(msgs, m)
		}
	}
	switch {
	case t.failed:
		res.Outcome = Fail
		res.Reason = strings.Join(msgs, "\n")
	case t.skip != "":
		res.Outcome, res.Reason = Skip, t.skip
	default:
		res.Outcome = Pass
	}
	return res
}

// sawController records a controller name an import carries, for the
// report's implementation name.
func (s *Suite) sawController(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.controllers[name] = true
}
