package conformance

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// offlineSuite runs tests that touch no cluster.
func offlineSuite(tests ...Test) *Suite {
	return &Suite{cfg: Config{PollTimeout: time.Second}, clusters: []*Cluster{{Name: "a"}, {Name: "b"}}, tests: tests, controllers: map[string]bool{}}
}

func TestATestsOutcomeIsWhatItSaid(t *testing.T) {
	var order []string
	for _, tc := range []struct {
		name    string
		run     func(t *T)
		outcome Outcome
		reason  string
	}{
		{"a test that returns passes", func(t *T) {}, Pass, ""},
		{"an Errorf fails and goes on", func(t *T) { t.Errorf("one"); t.Errorf("two") }, Fail, "one\ntwo"},
		{"a Fatalf ends the test", func(t *T) { t.Fatalf("stop"); t.Errorf("never") }, Fail, "stop"},
		{"a Skipf skips with the reason", func(t *T) { t.Skipf("no %s", "gateway") }, Skip, "no gateway"},
		{"a panic fails", func(t *T) { panic("boom") }, Fail, "panic: boom"},
		{"cleanups run last registered first, even after a Fatalf", func(t *T) {
			order = nil
			t.Cleanup(func() { order = append(order, "first") })
			t.Cleanup(func() { order = append(order, "second") })
			t.Fatalf("stop")
		}, Fail, "stop"},
		{"logs show only when the test fails", func(t *T) { t.Logf("noise") }, Pass, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := offlineSuite()
			res := s.RunTest(context.Background(), Test{Name: tc.name, Label: Required, Run: tc.run})
			assert.Equal(t, tc.outcome, res.Outcome)
			if tc.outcome == Fail && tc.reason == "panic: boom" {
				assert.Contains(t, res.Reason, tc.reason)
			} else {
				assert.Equal(t, tc.reason, res.Reason)
			}
		})
	}
	assert.Equal(t, []string{"second", "first"}, order)
}

func TestATestNeedingMoreClustersIsSkippedWithTheReason(t *testing.T) {
	ran := false
	res := offlineSuite().RunTest(context.Background(), Test{Name: "x", Label: Required, Clusters: 3, Run: func(t *T) { ran = true }})
	assert.False(t, ran)
	assert.Equal(t, Skip, res.Outcome)
	assert.Equal(t, "needs 3 clusters, --contexts names 2", res.Reason)
}

func TestTheReportCountsEachLabelAndWritesYAMLAndHTML(t *testing.T) {
	s := offlineSuite(
		Test{Name: "passes", Requirement: "req <a>", Label: Required, Run: func(t *T) {}},
		Test{Name: "fails", Requirement: "req", Label: Required, Run: func(t *T) { t.Errorf("bad <script>") }},
		Test{Name: "skips", Requirement: "req", Label: Optional, Run: func(t *T) { t.Skipf("no feature") }},
	)
	s.cfg.ImplementationVersion = "v1.2.3"
	s.sawController("example.com/import-controller")
	var names []string
	report := s.Run(context.Background(), func(tc Test, run func() Result) {
		names = append(names, tc.Name)
		run()
	})
	assert.Equal(t, []string{"passes", "fails", "skips"}, names)
	assert.Equal(t, Counts{Pass: 1, Fail: 1}, report.Summary[Required])
	assert.Equal(t, Counts{Skip: 1}, report.Summary[Optional])
	assert.False(t, report.Passed())
	assert.Equal(t, Implementation{Name: "example.com/import-controller", Version: "v1.2.3"}, report.Implementation)

	dir := t.TempDir()
	require.NoError(t, report.Write(dir))
	data, err := os.ReadFile(filepath.Join(dir, "report.yaml"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, yaml.Unmarshal(data, &back))
	assert.Equal(t, report.Summary, back.Summary)
	require.Len(t, back.Tests, 3)
	assert.Equal(t, Fail, back.Tests[1].Outcome)
	assert.Equal(t, "bad <script>", back.Tests[1].Reason)
	html, err := os.ReadFile(filepath.Join(dir, "report.html"))
	require.NoError(t, err)
	assert.Contains(t, string(html), "bad &lt;script&gt;", "the page escapes what tests say")
	assert.NotContains(t, string(html), "<script>")
	assert.Contains(t, string(html), "example.com/import-controller v1.2.3")
}

func TestTheConfigSaysEverythingWrongAtOnce(t *testing.T) {
	c := Config{Contexts: []string{"a", "a"}, ClusterNames: []string{"x"}, Run: "(", Labels: []string{"Mandatory"}}
	err := c.Validate()
	require.Error(t, err)
	for _, want := range []string{`names "a" twice`, "1 names for 2 contexts", "--poll-timeout", "--run", `"Mandatory"`} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestTheConfigRefusesHalfAMembershipHookAndAnIncompleteDataPath(t *testing.T) {
	base := func() Config {
		return Config{Contexts: []string{"a", "b"}, PollTimeout: time.Second}
	}
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string
	}{
		{"both membership commands", func(c *Config) { c.MemberLeaveCommand, c.MemberJoinCommand = "leave", "join" }, nil},
		{"a leave without a join", func(c *Config) { c.MemberLeaveCommand = "leave" }, []string{"go together"}},
		{"a join without a leave", func(c *Config) { c.MemberJoinCommand = "join" }, []string{"go together"}},
		{"a whole data path", func(c *Config) {
			c.DataPath = DataPath{URL: "http://127.0.0.1:8080", Context: "b", Import: "ns/pool", Model: "m"}
		}, nil},
		{"a data path of another cluster, without an import or a model", func(c *Config) { c.DataPath = DataPath{URL: "http://127.0.0.1:8080", Context: "z", Import: "pool"} },
			[]string{`--datapath-context "z"`, `--datapath-import "pool"`, "--datapath-model"}},
		{"no data path at all", func(c *Config) { c.DataPath = DataPath{Context: "z"} }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.change(&c)
			err := c.Validate()
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, want := range tc.want {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

func TestAResultSaysHowLongTheTestTook(t *testing.T) {
	res := offlineSuite().RunTest(context.Background(), Test{Name: "x", Label: Required, Run: func(t *T) { time.Sleep(50 * time.Millisecond) }})
	assert.GreaterOrEqual(t, res.Duration, 50*time.Millisecond)
	assert.GreaterOrEqual(t, res.Seconds, 0.05)
}
