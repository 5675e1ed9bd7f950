package localclusterset

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A member leaves the local ClusterSet as one leaves a real one: every
// mci-apiserver stops finding it in the member list it watches (the
// kubeconfig directories of --member-kubeconfig-dir), and its imports go
// away in the others. Its kubeconfigs are kept aside in leftMembersDir so
// that it can join again with the same credentials.

// leftMembersDir holds the member kubeconfigs of the clusters that left,
// under the path they had relative to the ClusterSet's directory.
const leftMembersDir = "members-left"

// memberKubeconfigs are the member kubeconfig files of cluster in every
// member directory of the ClusterSet (the shared one, and the per-cluster
// ones of reader identities and links), relative to cs.Dir, whether or not
// they exist.
func (cs *ClusterSet) memberKubeconfigs(cluster string) []string {
	file := cluster + ".kubeconfig"
	paths := []string{filepath.Join("members", file)}
	for _, perCluster := range []string{readerMembersDir, linkMembersDir} {
		for _, w := range cs.Clusters {
			paths = append(paths, filepath.Join(perCluster, w.Name, file))
		}
	}
	return paths
}

// Leave takes cluster out of the ClusterSet: no mci-apiserver finds it
// among its members any more. Leaving twice is an error, so that a test
// that loses track of membership says so.
func (cs *ClusterSet) Leave(cluster string) error {
	if _, err := cs.Cluster(cluster); err != nil {
		return err
	}
	return cs.moveMemberKubeconfigs(cluster, cs.Dir, filepath.Join(cs.Dir, leftMembersDir))
}

// Join puts back a cluster that left with Leave.
func (cs *ClusterSet) Join(cluster string) error {
	if _, err := cs.Cluster(cluster); err != nil {
		return err
	}
	return cs.moveMemberKubeconfigs(cluster, filepath.Join(cs.Dir, leftMembersDir), cs.Dir)
}

// moveMemberKubeconfigs moves cluster's member kubeconfigs from one tree
// to the other; it fails when none was there to move.
func (cs *ClusterSet) moveMemberKubeconfigs(cluster, from, to string) error {
	moved := 0
	for _, rel := range cs.memberKubeconfigs(cluster) {
		src, dst := filepath.Join(from, rel), filepath.Join(to, rel)
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return fmt.Errorf("clusterset: moving %s's member kubeconfig: %w", cluster, err)
		}
		moved++
	}
	if moved == 0 {
		return fmt.Errorf("clusterset: no member kubeconfig of %s in %s (has it already left, or joined?)", cluster, from)
	}
	return nil
}
