package clusterset

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/metrics/testutil"
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

func TestAKubeconfigNamingTheLocalClusterIsReportedOncePerChange(t *testing.T) {
	good := func(server string) MemberConfig { return ParseMemberKubeconfig(kubeconfigFor(server)) }
	d := newDesiredMembers("local")
	steps := []struct {
		source  string
		members map[string]MemberConfig
		want    bool
	}{
		{"secrets", map[string]MemberConfig{"local": good("https://elsewhere")}, true},
		{"secrets", map[string]MemberConfig{"local": good("https://elsewhere"), "a": good("https://a")}, false},
		{"dir", map[string]MemberConfig{"local": good("https://elsewhere")}, true},
		{"secrets", map[string]MemberConfig{"local": good("https://moved")}, true},
		{"secrets", map[string]MemberConfig{}, false},
		{"secrets", map[string]MemberConfig{"local": good("https://moved")}, true},
	}
	for i, s := range steps {
		assert.Equal(t, s.want, d.newLocalClaim(s.source, s.members), "step %d", i)
		for _, c := range d.update(s.source, s.members) {
			assert.NotEqual(t, "local", c.name, "step %d: the local cluster never comes from a source", i)
		}
	}
}

func TestAKubeconfigFromASecretMustBeSelfContained(t *testing.T) {
	const head = `apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: c, user: u}}]
`
	// Without contexts, client-go uses the cluster and the user named "".
	const unnamed = "apiVersion: v1\nkind: Config\nclusters: [{name: \"\", cluster: {server: \"https://a\"}}]\n"
	exec := `{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "echo secret-arg"], interactiveMode: Never}}`
	tests := []struct {
		name       string
		kubeconfig string
		wantErr    []string
	}{
		{
			name:       "inline data and a token are self-contained",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\", certificate-authority-data: " + caData + "}}]\nusers: [{name: u, user: {token: t}}]\n",
		},
		{
			name:       "a proxy is no local reference: the member's TLS is verified through it",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\", proxy-url: \"http://127.0.0.1:3128\"}}]\nusers: [{name: u, user: {token: t}}]\n",
		},
		{
			name:       "an exec plugin would run a command",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\"}}]\nusers: [{name: u, user: " + exec + "}]\n",
			wantErr:    []string{"self-contained", `user "u": exec runs a command`},
		},
		{
			name:       "an exec plugin of the user named empty, used when there is no context, would run a command",
			kubeconfig: unnamed + "users: [{name: \"\", user: " + exec + "}]\n",
			wantErr:    []string{"self-contained", `user "": exec runs a command`},
		},
		{
			name:       "a token file of the user named empty, used when there is no context, would send the server's own file",
			kubeconfig: unnamed + "users: [{name: \"\", user: {tokenFile: " + existingFile(t) + "}}]\n",
			wantErr:    []string{`user "": tokenFile names a file`},
		},
		{
			name:       "a CA file of the cluster named empty would be read from the server's disk",
			kubeconfig: "apiVersion: v1\nkind: Config\nclusters: [{name: \"\", cluster: {server: \"https://a\", certificate-authority: " + existingFile(t) + "}}]\nusers: [{name: \"\", user: {token: t}}]\n",
			wantErr:    []string{`cluster "": certificate-authority names a file`},
		},
		{
			name:       "an exec plugin of a user no context names is refused too",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\"}}]\nusers: [{name: u, user: {token: t}}, {name: spare, user: " + exec + "}]\n",
			wantErr:    []string{`user "spare": exec runs a command`},
		},
		{
			name:       "an auth provider would run a plugin",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\"}}]\nusers: [{name: u, user: {auth-provider: {name: oidc, config: {id-token: secret-token}}}}]\n",
			wantErr:    []string{`user "u": auth-provider runs a plugin`},
		},
		{
			name:       "a token file would send the server's own file",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\"}}]\nusers: [{name: u, user: {tokenFile: " + existingFile(t) + "}}]\n",
			wantErr:    []string{`user "u": tokenFile names a file`},
		},
		{
			name:       "a CA file would be read from the server's disk",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\", certificate-authority: " + existingFile(t) + "}}]\nusers: [{name: u, user: {token: t}}]\n",
			wantErr:    []string{`cluster "c": certificate-authority names a file`},
		},
		{
			name:       "a client certificate file would be read from the server's disk",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\"}}]\nusers: [{name: u, user: {client-certificate: " + existingFile(t) + ", client-key: " + existingFile(t) + "}}]\n",
			wantErr:    []string{`user "u": client-certificate or client-key names a file`},
		},
		{
			name:       "skipping TLS verification would send the token to whoever answers",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"https://a\", insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: secret-token}}]\n",
			wantErr:    []string{`cluster "c": insecure-skip-tls-verify`},
		},
		{
			name:       "a plaintext server is refused: nothing could vouch for the member's data",
			kubeconfig: head + "clusters: [{name: c, cluster: {server: \"http://a\"}}]\nusers: [{name: u, user: {token: secret-token}}]\n",
			wantErr:    []string{"not reached over TLS"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mc := parseSecretKubeconfig([]byte(tc.kubeconfig))
			assert.NotEmpty(t, mc.fingerprint)
			if len(tc.wantErr) == 0 {
				require.NoError(t, mc.err)
				require.NotNil(t, mc.rest)
				assert.Empty(t, resolvedProblems(mc.rest, nil))
				return
			}
			require.Error(t, mc.err)
			assert.Nil(t, mc.rest, "no connection is made from it")
			for _, want := range tc.wantErr {
				assert.Contains(t, mc.err.Error(), want)
			}
			assert.NotContains(t, mc.err.Error(), "secret-", "values are never quoted")
		})
	}

	t.Run("the member directory may reference files", func(t *testing.T) {
		mc := ParseMemberKubeconfig([]byte(head + "clusters: [{name: c, cluster: {server: \"https://a\"}}]\nusers: [{name: u, user: {tokenFile: " + existingFile(t) + "}}]\n"))
		require.NoError(t, mc.err)
	})
}

// What client-go resolves is checked whatever led to it: each of these
// would run or read something local, or talk without verified TLS.
func TestResolvedProblems(t *testing.T) {
	tests := []struct {
		name   string
		config rest.Config
		want   string
	}{
		{name: "an exec plugin", config: rest.Config{Host: "https://a", ExecProvider: &clientcmdapi.ExecConfig{Command: "sh"}}, want: "exec plugin"},
		{name: "an auth provider", config: rest.Config{Host: "https://a", AuthProvider: &clientcmdapi.AuthProviderConfig{Name: "oidc"}}, want: "auth-provider"},
		{name: "a token file", config: rest.Config{Host: "https://a", BearerTokenFile: "/var/run/secrets/token"}, want: "token from a file"},
		{name: "a CA file", config: rest.Config{Host: "https://a", TLSClientConfig: rest.TLSClientConfig{CAFile: "/ca"}}, want: "CA from a file"},
		{name: "a key file", config: rest.Config{Host: "https://a", TLSClientConfig: rest.TLSClientConfig{KeyFile: "/key"}}, want: "certificate or key from a file"},
		{name: "no TLS verification", config: rest.Config{Host: "https://a", TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, want: "skips TLS verification"},
		{name: "plaintext", config: rest.Config{Host: "http://a", BearerToken: "t"}, want: "not reached over TLS"},
		{name: "a host without scheme and without TLS data", config: rest.Config{Host: "a:6443"}, want: "not reached over TLS"},
		{name: "a server that is no URL", config: rest.Config{Host: "https://127.0.0.1:port"}, want: "not a URL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Contains(t, strings.Join(resolvedProblems(&tc.config, nil), "; "), tc.want)
		})
	}
	assert.Empty(t, resolvedProblems(&rest.Config{Host: "https://a", BearerToken: "t", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca")}}, nil))
	assert.Empty(t, resolvedProblems(&rest.Config{Host: "a:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca")}}, nil), "TLS data makes a host without scheme https, as client-go does")
}

// caData stands for inline CA data, base64 as kubeconfig data fields
// carry it; it is parsed when a connection is made, not here.
var caData = base64.StdEncoding.EncodeToString([]byte("inline CA data"))

// existingFile is a file the kubeconfig can name: validation checks that
// named files exist.
func existingFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(path, []byte("content"), 0o600))
	return path
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

	members, err := readMemberDir(dir, nil)
	require.NoError(t, err)
	require.Len(t, members, 3, "hidden entries and folders (Secret volume internals) are skipped")
	assert.Equal(t, "https://a", members["cluster-a"].rest.Host, "the .kubeconfig extension is dropped")
	assert.Equal(t, "https://b", members["cluster-b"].rest.Host, "the .yaml extension is dropped")
	assert.Error(t, members["cluster-c"].err)

	// Read again, an unchanged file keeps its parse and a changed one is
	// parsed anew.
	write("cluster-b.yaml", kubeconfigFor("https://b2"))
	again, err := readMemberDir(dir, members)
	require.NoError(t, err)
	assert.Same(t, members["cluster-a"].rest, again["cluster-a"].rest, "an unchanged kubeconfig is not parsed again")
	assert.Equal(t, "https://b2", again["cluster-b"].rest.Host, "a changed kubeconfig is parsed again")
	assert.NotEqual(t, members["cluster-b"].fingerprint, again["cluster-b"].fingerprint)
	assert.Error(t, again["cluster-c"].err)

	_, err = readMemberDir(filepath.Join(dir, "missing"), nil)
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

func TestARefusedMemberConfigIsCountedOncePerChange(t *testing.T) {
	refused := func() float64 {
		v, err := testutil.GetCounterMetricValue(memberConfigRejected.WithLabelValues("secrets"))
		require.NoError(t, err)
		return v
	}
	exec := []byte("apiVersion: v1\nkind: Config\nclusters: [{name: \"\", cluster: {server: \"https://a\"}}]\nusers: [{name: \"\", user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true}}}]\n")
	before := refused()
	d := newDesiredMembers("local")
	d.update("secrets:mci-system", map[string]MemberConfig{"a": parseSecretKubeconfig(exec)})
	d.update("secrets:mci-system", map[string]MemberConfig{"a": parseSecretKubeconfig(exec)})
	assert.Equal(t, before+1, refused(), "the same refused kubeconfig is counted once")
	d.update("secrets:mci-system", map[string]MemberConfig{"a": parseSecretKubeconfig(append(exec, '\n'))})
	assert.Equal(t, before+2, refused(), "a changed one is counted again")
}

// A member's labels are its Secret's (or ClusterProfile's), from the first
// source that names it, the local cluster's included: an export's scope
// selects members by them.
func TestMemberLabelsComeFromTheSourceThatNamesTheMember(t *testing.T) {
	secret := func(name, cluster, region string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mci-system", Labels: map[string]string{MemberClusterLabel: cluster, "region": region}},
			Data:       map[string][]byte{MemberKubeconfigKey: kubeconfigFor("https://" + name)},
		}
	}
	d := newDesiredMembers("cluster-a")
	d.update("dir", map[string]MemberConfig{"cluster-c": ParseMemberKubeconfig(kubeconfigFor("https://c"))})
	d.update("secrets", membersFromSecrets([]*corev1.Secret{secret("a", "cluster-a", "eu"), secret("b", "cluster-b", "us"), secret("c", "cluster-c", "eu")}))
	got := d.metas()
	assert.Equal(t, "eu", got["cluster-a"].labels["region"], "the local cluster's labels, from the ClusterSet-wide list")
	assert.Equal(t, "us", got["cluster-b"].labels["region"])
	assert.Nil(t, got["cluster-c"].labels, "cluster-c is the directory's, which has no labels")
}
