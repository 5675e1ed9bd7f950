package clusterset

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func kubeconfigFor(server string) []byte {
	return []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
}

func TestParseMemberKubeconfig(t *testing.T) {
	tests := []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{name: "a valid kubeconfig connects", data: kubeconfigFor("https://127.0.0.1:6443")},
		{name: "an empty kubeconfig is an error", data: nil, wantErr: "kubeconfig is empty"},
		{name: "garbage is an error, not a panic", data: []byte("\x00\x01{not yaml"), wantErr: "invalid kubeconfig"},
		{name: "a kubeconfig without a current context is an error", data: []byte("apiVersion: v1\nkind: Config\n"), wantErr: "invalid kubeconfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mc := ParseMemberKubeconfig(tc.data)
			assert.NotEmpty(t, mc.fingerprint)
			if tc.wantErr != "" {
				require.Error(t, mc.err)
				assert.Contains(t, mc.err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, mc.err)
			assert.Equal(t, "https://127.0.0.1:6443", mc.rest.Host)
		})
	}
}

func TestDesiredMembers(t *testing.T) {
	good := func(server string) MemberConfig { return ParseMemberKubeconfig(kubeconfigFor(server)) }
	bad := ParseMemberKubeconfig([]byte("nope"))
	type step struct {
		source  string
		members map[string]MemberConfig
		// want: name -> "connect", "bad" or "remove"
		want map[string]string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "members join, are left alone while unchanged, and leave",
			steps: []step{
				{"dir", map[string]MemberConfig{"a": good("https://a"), "b": good("https://b")}, map[string]string{"a": "connect", "b": "connect"}},
				{"dir", map[string]MemberConfig{"a": good("https://a"), "b": good("https://b")}, map[string]string{}},
				{"dir", map[string]MemberConfig{"a": good("https://a")}, map[string]string{"b": "remove"}},
			},
		},
		{
			name: "a changed kubeconfig reconnects the member",
			steps: []step{
				{"dir", map[string]MemberConfig{"a": good("https://a")}, map[string]string{"a": "connect"}},
				{"dir", map[string]MemberConfig{"a": good("https://a2")}, map[string]string{"a": "connect"}},
			},
		},
		{
			name: "the local cluster is never taken from a source",
			steps: []step{
				{"dir", map[string]MemberConfig{"local": good("https://elsewhere"), "a": good("https://a")}, map[string]string{"a": "connect"}},
			},
		},
		{
			name: "a bad kubeconfig is reported once and keeps the working connection",
			steps: []step{
				{"dir", map[string]MemberConfig{"a": good("https://a")}, map[string]string{"a": "connect"}},
				{"dir", map[string]MemberConfig{"a": bad}, map[string]string{"a": "bad"}},
				{"dir", map[string]MemberConfig{"a": bad}, map[string]string{}},
				{"dir", map[string]MemberConfig{"a": good("https://a3")}, map[string]string{"a": "connect"}},
			},
		},
		{
			name: "a cluster named by two sources comes from the first that named it",
			steps: []step{
				{"dir", map[string]MemberConfig{"a": good("https://from-dir")}, map[string]string{"a": "connect"}},
				{"secrets", map[string]MemberConfig{"a": good("https://from-secret"), "b": good("https://b")}, map[string]string{"b": "connect"}},
				{"dir", map[string]MemberConfig{}, map[string]string{"a": "connect"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDesiredMembers("local")
			for i, s := range tc.steps {
				got := map[string]string{}
				for _, c := range d.update(s.source, s.members) {
					switch {
					case c.config == nil:
						got[c.name] = "remove"
					case c.err != nil:
						got[c.name] = "bad"
					default:
						got[c.name] = "connect"
					}
				}
				assert.Equal(t, s.want, got, "step %d", i)
			}
		})
	}
}

func TestReadMemberDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	write("cluster-a.kubeconfig", kubeconfigFor("https://a"))
	write("cluster-b.yaml", kubeconfigFor("https://b"))
	write("cluster-c", []byte("not a kubeconfig"))
	write(".hidden", kubeconfigFor("https://hidden"))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "..data"), 0o700))

	members, err := readMemberDir(dir)
	require.NoError(t, err)
	require.Len(t, members, 3, "hidden entries and folders (Secret volume internals) are skipped")
	assert.Equal(t, "https://a", members["cluster-a"].rest.Host, "the .kubeconfig extension is dropped")
	assert.Equal(t, "https://b", members["cluster-b"].rest.Host, "the .yaml extension is dropped")
	assert.Error(t, members["cluster-c"].err)

	_, err = readMemberDir(filepath.Join(dir, "missing"))
	assert.Error(t, err)
}

func TestMembersFromSecrets(t *testing.T) {
	secret := func(name, cluster string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mci-system", Labels: map[string]string{MemberClusterLabel: cluster}},
			Data:       data,
		}
	}
	members := membersFromSecrets([]*corev1.Secret{
		secret("b-1", "cluster-b", map[string][]byte{MemberKubeconfigKey: kubeconfigFor("https://b")}),
		secret("a-2", "cluster-a", map[string][]byte{MemberKubeconfigKey: kubeconfigFor("https://a2")}),
		secret("a-1", "cluster-a", map[string][]byte{MemberKubeconfigKey: kubeconfigFor("https://a1")}),
		secret("c", "cluster-c", map[string][]byte{"config": kubeconfigFor("https://c")}),
		secret("bad-name", "Not_A_Name", map[string][]byte{MemberKubeconfigKey: kubeconfigFor("https://x")}),
	})
	require.Len(t, members, 3)
	assert.Equal(t, "https://a1", members["cluster-a"].rest.Host, "duplicate cluster names: the first Secret by name wins")
	assert.Equal(t, "https://b", members["cluster-b"].rest.Host)
	require.Error(t, members["cluster-c"].err)
	assert.Contains(t, members["cluster-c"].err.Error(), `no "kubeconfig" key`)
}
