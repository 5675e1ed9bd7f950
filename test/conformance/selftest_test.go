// Package conformance holds the conformance suite's self-test: the suite
// run against a local ClusterSet whose mci-apiservers are deliberately
// misconfigured must fail the tests that check what was broken. A suite
// that passes everything is not yet evidence that it can fail.
package conformance

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/conformance"
	"github.com/mci-dev/mci/test/localclusterset"
)

// A fault breaks the implementation in one way, and names the Required
// tests that must catch it.
type fault struct {
	name    string
	inject  func(ctx context.Context, cs *localclusterset.ClusterSet) error
	restore func(ctx context.Context, cs *localclusterset.ClusterSet) error
	// run picks the tests to run (those that must fail, and those that
	// must still pass) so that the self-test stays short.
	run      string
	mustFail []string
	// brokenPoll is the poll timeout of the broken run, 5 s when 0: long
	// enough that a healthy implementation would pass (a fault whose test
	// waits out a member directory's re-read needs the default).
	brokenPoll time.Duration
}

var faults = []fault{
	{
		name: "the exporter writes no Exported condition (--exported-status=false)",
		inject: func(ctx context.Context, cs *localclusterset.ClusterSet) error {
			return cs.RestartMCIAPIServerWithArgs(ctx, "cluster-a", "--exported-status=false")
		},
		restore: func(ctx context.Context, cs *localclusterset.ClusterSet) error {
			return cs.RestartMCIAPIServerWithArgs(ctx, "cluster-a")
		},
		run: "Exported|exists in another member",
		mustFail: []string{
			"the exported pool reports Exported False while a member lacks its namespace, True once all import it, and loses it with the annotation",
			"an export annotation with an unknown value reports Exported False",
		},
	},
	{
		name: "an importer serves no imports (its mci-apiserver is stopped)",
		inject: func(ctx context.Context, cs *localclusterset.ClusterSet) error {
			return cs.StopMCIAPIServer("cluster-b")
		},
		restore: func(ctx context.Context, cs *localclusterset.ClusterSet) error {
			return cs.StartMCIAPIServer(ctx, "cluster-b")
		},
		run: "exists in another member|exporting cluster serves no import",
		mustFail: []string{
			"an import exists in another member exactly while a pool is exported",
			"the exporting cluster serves no import of its own pool",
		},
	},
	{
		// The member-leave command really takes the member out of the
		// ClusterSet's member list; cluster-b's server reads a copy of
		// that list taken before (--member-kubeconfig-dir, the flag an
		// operator sets), so it keeps serving what the departed member
		// exported, as an implementation that does not follow membership
		// would.
		name: "an importer keeps a departed member (its member list is a copy that does not follow the ClusterSet)",
		inject: func(ctx context.Context, cs *localclusterset.ClusterSet) error {
			snapshot := filepath.Join(cs.Dir, "members-snapshot")
			if err := os.CopyFS(snapshot, os.DirFS(cs.MembersDir())); err != nil {
				return err
			}
			return cs.RestartMCIAPIServerWithArgs(ctx, "cluster-b", "--member-kubeconfig-dir="+snapshot)
		},
		restore: func(ctx context.Context, cs *localclusterset.ClusterSet) error {
			if err := cs.RestartMCIAPIServerWithArgs(ctx, "cluster-b"); err != nil {
				return err
			}
			return os.RemoveAll(filepath.Join(cs.Dir, "members-snapshot"))
		},
		run: "leaves the ClusterSet",
		mustFail: []string{
			"a member that leaves the ClusterSet is dropped from every import, and the others' exports stay imported",
		},
		// mci-apiserver reads its member directory every 10 s: with a
		// shorter wait the healthy server would fail the test too.
		brokenPoll: conformance.DefaultPollTimeout,
	},
}

func TestTheRequiredTestsCatchABrokenImplementation(t *testing.T) {
	if os.Getenv("MCI_CONFORMANCE_SELFTEST") == "" {
		t.Skip("starts a local ClusterSet and breaks it: make conformance-selftest sets MCI_CONFORMANCE_SELFTEST")
	}
	mci, err := localclusterset.Binary("mci-apiserver")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), MCIAPIServerBinary: mci, Log: os.Stderr})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	var kubeconfigs []string
	for _, name := range cs.Names() {
		c, err := cs.Cluster(name)
		require.NoError(t, err)
		kubeconfigs = append(kubeconfigs, c.Kubeconfig)
	}
	// A member leaves this ClusterSet when its kubeconfig is taken out of
	// the member directory every mci-apiserver reads (as `clusterset
	// leave` does for a detached ClusterSet).
	members, left := cs.MembersDir(), filepath.Join(cs.Dir, "members-left")
	require.NoError(t, os.MkdirAll(left, 0o700))
	member := `"${MCI_CONFORMANCE_MEMBER}.kubeconfig"`
	config := func(run string, poll time.Duration) conformance.Config {
		return conformance.Config{
			Kubeconfig:         strings.Join(kubeconfigs, string(filepath.ListSeparator)),
			Contexts:           cs.Names(),
			PollTimeout:        poll,
			Labels:             []string{string(conformance.Required)},
			Run:                run,
			MemberLeaveCommand: fmt.Sprintf("cd '%s' && mv %s '%s/'", members, member, left),
			MemberJoinCommand:  fmt.Sprintf("cd '%s' && mv %s '%s/'", left, member, members),
		}
	}
	outcomes := func(t *testing.T, run string, poll time.Duration) map[string]conformance.Result {
		suite, err := conformance.NewSuite(ctx, config(run, poll))
		require.NoError(t, err)
		report := suite.Run(ctx, func(_ conformance.Test, run func() conformance.Result) { run() })
		out := map[string]conformance.Result{}
		for _, r := range report.Tests {
			out[r.Name] = r
		}
		return out
	}

	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			// The healthy run has the default poll timeout (a member whose
			// mci-apiserver the previous fault restarted may take a few
			// seconds to be read again); the broken run a short one (brokenPoll), since
			// the tests that catch the fault wait it out.
			healthy := outcomes(t, f.run, conformance.DefaultPollTimeout)
			for _, name := range f.mustFail {
				require.Contains(t, healthy, name, "the fault names a test the suite does not have")
				require.Equal(t, conformance.Pass, healthy[name].Outcome, "the healthy implementation must pass %q first: %s", name, healthy[name].Reason)
			}
			require.NoError(t, f.inject(ctx, cs))
			broken := outcomes(t, f.run, cmp.Or(f.brokenPoll, 5*time.Second))
			require.NoError(t, f.restore(ctx, cs))
			for _, name := range f.mustFail {
				assert.Equal(t, conformance.Fail, broken[name].Outcome, "%q did not catch the fault", name)
				t.Logf("caught by %q: %s", name, firstLine(broken[name].Reason))
			}
		})
	}
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}
