package conformance

// A member leaving the ClusterSet withdraws what it exported. How a member
// leaves is the implementation's (a fleet membership deleted, a
// ClusterProfile removed, a member Secret deleted), so the runner says it
// with --member-leave-command and --member-join-command; the test is
// skipped, saying so, without them.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

const reqMemberLeaves = "Proposal, Workflow 2: the controller CRUDs an import in each member cluster of the ClusterSet " +
	"(upstream 1374, Export Controller: for each ClusterSet member cluster), so a cluster that leaves the ClusterSet " +
	"stops being an exporting cluster of every import, and the other members' exports are imported as before"

// hookTimeout bounds a membership command: it changes membership, the
// test then waits its poll timeout for the imports to follow.
const hookTimeout = 2 * time.Minute

func membershipTests() []Test {
	return []Test{{
		Name:        "a member that leaves the ClusterSet is dropped from every import, and the others' exports stay imported",
		Requirement: reqMemberLeaves,
		Label:       Required,
		Clusters:    3,
		Run:         testMemberLeaves,
	}}
}

func testMemberLeaves(t *T) {
	cfg := t.suite.cfg
	if cfg.MemberLeaveCommand == "" {
		t.Skipf("no --member-leave-command: the runner has not said how a member leaves this ClusterSet")
	}
	cs := t.Clusters()
	a, b, leaver := cs[0], cs[1], cs[len(cs)-1]
	f := newFixture(t)
	for _, c := range cs {
		f.createNamespace(c)
	}
	f.exportPool(a, "pool")
	f.exportPool(leaver, "pool")
	f.eventually(b.Name+" imports both exporters", f.importWith(b, "pool", a.Name, leaver.Name))
	f.eventually(a.Name+" imports the other exporter", f.importWith(a, "pool", leaver.Name))

	f.runMembershipHook("leave", cfg.MemberLeaveCommand, leaver)
	// The member joins again whatever happens, and the test waits for it:
	// the tests after this one need the whole ClusterSet.
	t.Cleanup(func() {
		f.runMembershipHook("join", cfg.MemberJoinCommand, leaver)
		f.eventually(leaver.Name+" is imported again once it joined", f.importWith(b, "pool", a.Name, leaver.Name))
	})
	// importWith is exact: b's import lists a, which stayed, and no
	// longer the member that left.
	f.eventually(b.Name+" drops the member that left and keeps the other exporter", f.importWith(b, "pool", a.Name))
	f.eventually(a.Name+" serves no import once its only other exporter left", f.noImport(a, "pool"))
}

// runMembershipHook runs one of the runner's membership commands for
// member, failing the test with its output when it fails.
func (f *fixture) runMembershipHook(what, command string, member *Cluster) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx(), hookTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Env = append(os.Environ(), memberEnv(member)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		f.t.Fatalf("the member-%s command for %s failed: %v\n%s", what, member.Name, err, strings.TrimSpace(string(out)))
	}
}

// memberEnv tells a membership command which member it is about: its name
// in the ClusterSet and its kubeconfig context.
func memberEnv(c *Cluster) []string {
	return []string{
		fmt.Sprintf("MCI_CONFORMANCE_MEMBER=%s", c.Name),
		fmt.Sprintf("MCI_CONFORMANCE_CONTEXT=%s", c.Context),
	}
}
