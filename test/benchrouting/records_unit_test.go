package benchrouting

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

func TestWriteRecords(t *testing.T) {
	reqs := []workload.Request{
		{Index: 0, At: 1500 * time.Millisecond, Conversation: 2, Group: 0, Turn: 5},
		{Index: 1, At: 9 * time.Second, Conversation: -1, Group: -1, Turn: 1},
	}
	run := &runResult{outcomes: []outcome{
		{cluster: "cluster-c", code: 200, complete: true, ttft: 61 * time.Millisecond, e2e: 150 * time.Millisecond, promptTokens: 2264, cachedTokens: 2208},
		{cluster: saturatedCluster, code: 200, complete: true, ttft: 8638 * time.Millisecond, e2e: 8730 * time.Millisecond, promptTokens: 300, afterSaturation: true},
	}}
	t.Run("nothing without a directory", func(t *testing.T) {
		require.NoError(t, writeRecords("", "run", reqs, run))
	})
	t.Run("one line a request, in the workload's order", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "records")
		require.NoError(t, writeRecords(dir, "saturated-cluster-r1-PrefixAffinity", reqs, run))
		f, err := os.Open(filepath.Join(dir, "saturated-cluster-r1-PrefixAffinity.jsonl"))
		require.NoError(t, err)
		defer func() { _ = f.Close() }()
		var got []record
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r record
			require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
			got = append(got, r)
		}
		require.NoError(t, sc.Err())
		assert.Equal(t, []record{
			{Index: 0, AtMS: 1500, Group: 0, Conversation: 2, Turn: 5, Cluster: "cluster-c", Code: 200, Complete: true, TTFTMS: 61, E2EMS: 150, PromptTokens: 2264, CachedTokens: 2208},
			{Index: 1, AtMS: 9000, Group: -1, Conversation: -1, Turn: 1, Cluster: saturatedCluster, Code: 200, Complete: true, TTFTMS: 8638, E2EMS: 8730, PromptTokens: 300, AfterSaturation: true},
		}, got)
	})
}
