package localclusterset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A member leaves the local ClusterSet as one leaves a real one: every
// mci-apiserver stops finding it in the member list it watches (the
// kubeconfig directories of --member-kubeconfig-dir, and the member
// Secrets of its namespace for a member with labels), and its imports go
// away in the others. Its kubeconfigs and Secrets are kept aside in
// leftMembersDir so that it can join again with the same credentials.

const (
	// leftMembersDir holds the member kubeconfigs of the clusters that
	// left, under the path they had relative to the ClusterSet's directory.
	leftMembersDir = "members-left"
	// memberSecretsDir holds the member Secrets the harness created for
	// members with labels (Options.MemberLabels), as
	// <memberSecretsDir>/<watching cluster>/<member>.json: what Leave
	// deletes and Join creates again.
	memberSecretsDir = "member-secrets"
	// memberClusterLabel marks a member Secret, as mci-apiserver reads it
	// (--namespace); its value is the member's name, its key kubeconfig
	// holds the member's kubeconfig.
	memberClusterLabel  = "mci.x-k8s.io/member-cluster"
	memberKubeconfigKey = "kubeconfig"
)

// memberSecretTimeout bounds the writes of one Leave or Join.
const memberSecretTimeout = 30 * time.Second

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

// memberSecretFile is where the member Secret of member in watcher's
// cluster is recorded, relative to cs.Dir.
func memberSecretFile(watcher, member string) string {
	return filepath.Join(memberSecretsDir, watcher, member+".json")
}

// writeMemberSecrets gives every cluster's mci-apiservers the members of
// Options.MemberLabels by Secrets that carry their labels, in place of
// the files of their member kubeconfig directories (a member named by
// both would be read from the file, without labels): each Secret holds
// the kubeconfig that cluster's servers would have read from the file.
func (cs *ClusterSet) writeMemberSecrets(ctx context.Context) error {
	if len(cs.memberLabels) == 0 {
		return nil
	}
	var files []string
	for _, w := range cs.Clusters {
		kube, _, err := clients(w.Config)
		if err != nil {
			return err
		}
		if err := ensureNamespace(ctx, kube, MCIAPIServerNamespace); err != nil {
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		for _, c := range cs.Clusters {
			set, ok := cs.memberLabels[c.Name]
			if !ok {
				continue
			}
			file := filepath.Join(cs.MemberKubeconfigDir(w.Name), c.Name+".kubeconfig")
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			files = append(files, file)
			secret := &corev1.Secret{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
				ObjectMeta: metav1.ObjectMeta{Name: "member-" + c.Name, Namespace: MCIAPIServerNamespace, Labels: maps.Clone(set)},
				Data:       map[string][]byte{memberKubeconfigKey: data},
			}
			if secret.Labels == nil {
				secret.Labels = map[string]string{}
			}
			secret.Labels[memberClusterLabel] = c.Name
			if err := cs.recordMemberSecret(memberSecretFile(w.Name, c.Name), secret); err != nil {
				return err
			}
			if _, err := kube.CoreV1().Secrets(MCIAPIServerNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("clusterset: creating %s's member Secret of %s: %w", w.Name, c.Name, err)
			}
		}
	}
	// Removed once every watcher has read them: without reader identities
	// or links, every watcher reads the one shared directory.
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (cs *ClusterSet) recordMemberSecret(rel string, s *corev1.Secret) error {
	path := filepath.Join(cs.Dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// Leave takes cluster out of the ClusterSet: no mci-apiserver finds it
// among its members any more. Leaving twice is an error, so that a test
// that loses track of membership says so.
func (cs *ClusterSet) Leave(ctx context.Context, cluster string) error {
	if _, err := cs.Cluster(cluster); err != nil {
		return err
	}
	moved, err := cs.moveMemberFiles(cluster, cs.Dir, filepath.Join(cs.Dir, leftMembersDir))
	if err != nil {
		return err
	}
	return cs.applyMemberSecrets(ctx, cluster, moved, filepath.Join(cs.Dir, leftMembersDir), false)
}

// Join puts back a cluster that left with Leave.
func (cs *ClusterSet) Join(ctx context.Context, cluster string) error {
	if _, err := cs.Cluster(cluster); err != nil {
		return err
	}
	moved, err := cs.moveMemberFiles(cluster, filepath.Join(cs.Dir, leftMembersDir), cs.Dir)
	if err != nil {
		return err
	}
	return cs.applyMemberSecrets(ctx, cluster, moved, cs.Dir, true)
}

// applyMemberSecrets deletes (create false) or creates the member Secrets
// of cluster that moved names, read from their records under root.
func (cs *ClusterSet) applyMemberSecrets(ctx context.Context, cluster string, moved map[string]bool, root string, create bool) error {
	ctx, cancel := context.WithTimeout(ctx, memberSecretTimeout)
	defer cancel()
	for _, w := range cs.Clusters {
		rel := memberSecretFile(w.Name, cluster)
		if !moved[rel] {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		var s corev1.Secret
		if err := json.Unmarshal(data, &s); err != nil {
			return fmt.Errorf("clusterset: %s: %w", rel, err)
		}
		kube, _, err := clients(w.Config)
		if err != nil {
			return err
		}
		secrets := kube.CoreV1().Secrets(s.Namespace)
		if create {
			_, err = secrets.Create(ctx, &s, metav1.CreateOptions{})
		} else if err = secrets.Delete(ctx, s.Name, metav1.DeleteOptions{}); apierrors.IsNotFound(err) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("clusterset: %s's member Secret of %s: %w", w.Name, cluster, err)
		}
	}
	return nil
}

// moveMemberFiles moves cluster's member kubeconfigs and Secret records
// from one tree to the other and says which moved (relative paths); it
// fails when none was there to move.
func (cs *ClusterSet) moveMemberFiles(cluster, from, to string) (map[string]bool, error) {
	moved := map[string]bool{}
	paths := cs.memberKubeconfigs(cluster)
	for _, w := range cs.Clusters {
		paths = append(paths, memberSecretFile(w.Name, cluster))
	}
	for _, rel := range paths {
		src, dst := filepath.Join(from, rel), filepath.Join(to, rel)
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, err
		}
		if err := os.Rename(src, dst); err != nil {
			return nil, fmt.Errorf("clusterset: moving %s's member kubeconfig: %w", cluster, err)
		}
		moved[rel] = true
	}
	if len(moved) == 0 {
		return nil, fmt.Errorf("clusterset: no member kubeconfig of %s in %s (has it already left, or joined?)", cluster, strings.TrimSuffix(from, string(filepath.Separator)))
	}
	return moved, nil
}
