package conformance

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// DefaultPollTimeout is how long a test waits, by default, for a change to
// show: long enough for an implementation that reacts to watches, short
// enough that a suite of a few dozen tests finishes in minutes.
const DefaultPollTimeout = 20 * time.Second

// Config says which clusters to test and how.
type Config struct {
	// Kubeconfig is the kubeconfig file, or several separated as in
	// KUBECONFIG; empty uses the default loading rules ($KUBECONFIG, then
	// ~/.kube/config).
	Kubeconfig string
	// Contexts are the kubeconfig contexts of the clusters under test, at
	// least two. Every member of the ClusterSet should be named: the
	// Exported condition is True only once every member imports a pool.
	Contexts []string
	// ClusterNames are the clusters' names in the ClusterSet, in the order
	// of Contexts; when empty, each cluster's About API ClusterProperty
	// cluster.clusterset.k8s.io names it, else its context name does.
	ClusterNames []string
	// PollTimeout bounds every wait for a change to show.
	PollTimeout time.Duration
	// ReportDir receives report.yaml and report.html; empty writes none.
	ReportDir string
	// Run, when set, runs only the tests whose name it matches.
	Run string
	// Labels, when set, runs only the tests of these labels.
	Labels []string
	// ImplementationName and ImplementationVersion go into the report; the
	// name defaults to the controller name the imports carry.
	ImplementationName    string
	ImplementationVersion string
	// WatchHistoryChanges is how many changes to one cluster's imports
	// push a resourceVersion out of the implementation's watch history: the
	// only way a client can get a resourceVersion too old to watch from.
	// 0 skips the test that needs one.
	WatchHistoryChanges int
}

// AddFlags registers the suite's flags on fs. They are the same under go
// test (-args --contexts=...) and in the mci-conformance command.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	if c.PollTimeout == 0 {
		c.PollTimeout = DefaultPollTimeout
	}
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig file(s) holding the contexts, separated by ':' as in KUBECONFIG (default: the KUBECONFIG loading rules)")
	fs.Func("contexts", "comma-separated kubeconfig contexts of the clusters under test, at least 2 (3 for the tests that need a bystander cluster)", func(s string) error {
		c.Contexts = splitList(s)
		return nil
	})
	fs.Func("cluster-names", "comma-separated names of the clusters in the ClusterSet, in the order of --contexts (default: each cluster's About API ClusterProperty cluster.clusterset.k8s.io, else its context name)", func(s string) error {
		c.ClusterNames = splitList(s)
		return nil
	})
	fs.DurationVar(&c.PollTimeout, "poll-timeout", c.PollTimeout, "how long each test waits for a change to show; raise it for slow clusters")
	fs.StringVar(&c.ReportDir, "report-dir", c.ReportDir, "directory to write report.yaml and report.html into (none written when empty)")
	fs.StringVar(&c.Run, "run", c.Run, "run only the tests whose name matches this regular expression")
	fs.Func("labels", "comma-separated labels of the tests to run: Required, Optional, Extended (default: all)", func(s string) error {
		c.Labels = splitList(s)
		return nil
	})
	fs.StringVar(&c.ImplementationName, "implementation-name", c.ImplementationName, "name of the implementation under test, for the report (default: the controller name its imports carry)")
	fs.IntVar(&c.WatchHistoryChanges, "watch-history-changes", c.WatchHistoryChanges, "how many import changes outrun the implementation's watch history, for the 410 Gone test, which exports that many pools (0 skips it)")
	fs.StringVar(&c.ImplementationVersion, "implementation-version", c.ImplementationVersion, "version of the implementation under test, for the report")
}

// Validate says what is wrong with c, all at once.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Contexts) < 2 {
		errs = append(errs, fmt.Errorf("--contexts names %d cluster(s): the suite needs at least 2", len(c.Contexts)))
	}
	seen := map[string]bool{}
	for _, ctx := range c.Contexts {
		if seen[ctx] {
			errs = append(errs, fmt.Errorf("--contexts names %q twice", ctx))
		}
		seen[ctx] = true
	}
	if len(c.ClusterNames) > 0 && len(c.ClusterNames) != len(c.Contexts) {
		errs = append(errs, fmt.Errorf("--cluster-names has %d names for %d contexts", len(c.ClusterNames), len(c.Contexts)))
	}
	if c.PollTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--poll-timeout is %s", c.PollTimeout))
	}
	if c.WatchHistoryChanges < 0 {
		errs = append(errs, fmt.Errorf("--watch-history-changes is %d", c.WatchHistoryChanges))
	}
	if c.Run != "" {
		if _, err := regexp.Compile(c.Run); err != nil {
			errs = append(errs, fmt.Errorf("--run: %w", err))
		}
	}
	for _, l := range c.Labels {
		if !Label(l).valid() {
			errs = append(errs, fmt.Errorf("--labels: %q is not one of Required, Optional, Extended", l))
		}
	}
	return errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
