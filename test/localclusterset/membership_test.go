package localclusterset

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A member leaves every member directory an mci-apiserver may be given,
// and joins back into each with the kubeconfig it had.
func TestAMemberLeavesEveryMemberDirectoryAndJoinsBack(t *testing.T) {
	cs := &ClusterSet{Dir: t.TempDir(), Clusters: []*Cluster{{Name: "cluster-a"}, {Name: "cluster-b"}}}
	files := []string{
		filepath.Join("members", "cluster-a.kubeconfig"),
		filepath.Join(readerMembersDir, "cluster-b", "cluster-a.kubeconfig"),
		filepath.Join(linkMembersDir, "cluster-b", "cluster-a.kubeconfig"),
	}
	stays := filepath.Join("members", "cluster-b.kubeconfig")
	for _, f := range append([]string{stays}, files...) {
		require.NoError(t, os.MkdirAll(filepath.Join(cs.Dir, filepath.Dir(f)), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(cs.Dir, f), []byte(f), 0o600))
	}

	require.NoError(t, cs.Leave(context.Background(), "cluster-a"))
	for _, f := range files {
		assert.NoFileExists(t, filepath.Join(cs.Dir, f), "after leaving")
	}
	assert.FileExists(t, filepath.Join(cs.Dir, stays), "the other member stays")
	assert.Error(t, cs.Leave(context.Background(), "cluster-a"), "a member that left cannot leave again")

	require.NoError(t, cs.Join(context.Background(), "cluster-a"))
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(cs.Dir, f))
		require.NoError(t, err, "after joining")
		assert.Equal(t, f, string(b), "the kubeconfig it had")
	}
	assert.Error(t, cs.Join(context.Background(), "cluster-a"), "a member cannot join twice")
	assert.Error(t, cs.Leave(context.Background(), "cluster-z"), "no such cluster")
}
