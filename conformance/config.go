package conformance

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
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
	// MemberLeaveCommand and MemberJoinCommand take a member out of the
	// ClusterSet and put it back: how is the implementation's (a fleet
	// membership, a ClusterProfile, a member Secret), so the runner says
	// it. Each runs with sh -c, the member in its environment (see
	// memberEnv). Empty skips the test that needs them.
	MemberLeaveCommand string
	MemberJoinCommand  string
	// MemberLabels are the labels each member has in the ClusterSet, by
	// member name, as the runner states them (--member-labels): which
	// labels a member has, and where they are written (a ClusterProfile, a
	// member Secret, a fleet's inventory), is the implementation's and the
	// ClusterSet's business, so the suite is told rather than looking.
	// Empty skips the test of scoping by selector; when given, it names
	// every member under test (a member without labels with none).
	MemberLabels map[string]map[string]string
	// DataPath names a data path the Extended tests send requests through.
	DataPath DataPath
}

// DataPath is a data path the operator set up: a Gateway in one of the
// clusters whose HTTPRoute sends DataPath.Path to an InferencePoolImport,
// and model servers behind the pools other members export. The suite
// sends requests to it and reads objects; it creates nothing for it.
type DataPath struct {
	// URL is the Gateway listener's base URL, reachable from the runner.
	URL string
	// Context is the kubeconfig context of the Gateway's (importing)
	// cluster, one of Contexts.
	Context string
	// Import is the namespace/name of the InferencePoolImport its route
	// sends to.
	Import string
	// Model is the model name of the requests.
	Model string
	// ServedByHeader, when set, is a response header whose value begins
	// with the name of the cluster whose model server answered, then "/".
	ServedByHeader string
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
	fs.StringVar(&c.MemberLeaveCommand, "member-leave-command", c.MemberLeaveCommand, "shell command that takes a member out of the ClusterSet, run with MCI_CONFORMANCE_MEMBER (its name in the ClusterSet) and MCI_CONFORMANCE_CONTEXT set (empty skips the member-leaving test)")
	fs.StringVar(&c.MemberJoinCommand, "member-join-command", c.MemberJoinCommand, "shell command that puts back a member --member-leave-command took out, run with the same environment")
	fs.Func("member-labels", "labels of one member of the ClusterSet, as <member>:<key>=<value>,... (<member>: for a member without labels); repeat it for every member under test, for the test of export scoping by label selector (none skips it)", func(s string) error {
		member, set, err := parseMemberLabels(s)
		if err != nil {
			return err
		}
		if c.MemberLabels == nil {
			c.MemberLabels = map[string]map[string]string{}
		}
		if _, dup := c.MemberLabels[member]; dup {
			return fmt.Errorf("member %q is given labels twice", member)
		}
		c.MemberLabels[member] = set
		return nil
	})
	fs.StringVar(&c.DataPath.URL, "datapath-url", c.DataPath.URL, "base URL of a Gateway listener in the importing cluster whose HTTPRoute sends /v1 to --datapath-import, for the Extended tests (empty skips them)")
	fs.StringVar(&c.DataPath.Context, "datapath-context", c.DataPath.Context, "kubeconfig context of the cluster whose Gateway --datapath-url is, one of --contexts")
	fs.StringVar(&c.DataPath.Import, "datapath-import", c.DataPath.Import, "namespace/name of the InferencePoolImport the Gateway's route sends to")
	fs.StringVar(&c.DataPath.Model, "datapath-model", c.DataPath.Model, "model name of the completion requests sent through the Gateway")
	fs.StringVar(&c.DataPath.ServedByHeader, "datapath-served-by-header", c.DataPath.ServedByHeader, "response header naming the model server that answered as <cluster>/<server>, so that the Extended tests can tell which cluster served (default: none; the tests then conclude from the route's only backend being the import)")
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
	if (c.MemberLeaveCommand == "") != (c.MemberJoinCommand == "") {
		errs = append(errs, errors.New("--member-leave-command and --member-join-command go together: a member that left must join again for the tests after it"))
	}
	errs = append(errs, c.DataPath.validate(c.Contexts)...)
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

// parseMemberLabels reads one --member-labels value,
// <member>:<key>=<value>,...: the labels are written as kubectl's --labels
// and must be valid label keys and values.
func parseMemberLabels(s string) (string, map[string]string, error) {
	member, list, ok := strings.Cut(s, ":")
	member = strings.TrimSpace(member)
	if !ok || member == "" {
		return "", nil, fmt.Errorf("%q is not <member>:<key>=<value>,...", s)
	}
	set, err := labels.ConvertSelectorToLabelsMap(strings.TrimSpace(list))
	if err != nil {
		return "", nil, fmt.Errorf("labels of %s: %w", member, err)
	}
	return member, set, nil
}

func (d DataPath) validate(contexts []string) []error {
	if d.URL == "" {
		return nil
	}
	var errs []error
	if !slices.Contains(contexts, d.Context) {
		errs = append(errs, fmt.Errorf("--datapath-context %q is not one of --contexts", d.Context))
	}
	if ns, name, ok := strings.Cut(d.Import, "/"); !ok || ns == "" || name == "" {
		errs = append(errs, fmt.Errorf("--datapath-import %q is not namespace/name", d.Import))
	}
	if d.Model == "" {
		errs = append(errs, errors.New("--datapath-model is required with --datapath-url"))
	}
	return errs
}
