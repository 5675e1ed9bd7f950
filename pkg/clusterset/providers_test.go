package clusterset

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"k8s.io/klog/v2"

	clusterinventory "github.com/mci-dev/mci/pkg/apis/clusterinventory/v1alpha1"
)

const providerFileJSON = `{"providers": [
  {"name": "token", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/token-plugin", "args": ["--x"], "env": [{"name": "A", "value": "operator"}], "provideClusterInfo": true},
   "profileSourcedCLIArgsPolicy": "Append", "profileSourcedEnvVarsPolicy": "AppendIfNotExists", "profileSourcedEnvVarNames": ["A", "B"]},
  {"name": "other", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/other"}}
]}`

func TestParseProviderFile(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		want    []string
		wantErr string
	}{
		{name: "a JSON file of providers parses", data: providerFileJSON, want: []string{"token", "other"}},
		{name: "YAML parses too", data: "providers:\n- name: token\n  execConfig:\n    apiVersion: client.authentication.k8s.io/v1\n    command: plugin\n", want: []string{"token"}},
		{name: "an empty file is an error", data: "", wantErr: "no providers"},
		{name: "garbage is an error, not a panic", data: "\x00\x01{[not", wantErr: "invalid provider file"},
		{name: "providers of the wrong type are an error", data: `{"providers": "x"}`, wantErr: "invalid provider file"},
		{name: "a provider without a name is an error", data: `{"providers": [{"execConfig": {"apiVersion": "v", "command": "c"}}]}`, wantErr: "name is empty"},
		{name: "a provider without execConfig is an error", data: `{"providers": [{"name": "a"}]}`, wantErr: "has no execConfig"},
		{name: "a provider without a command is an error", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v"}}]}`, wantErr: "command is empty"},
		{name: "a provider without an exec API version is an error", data: `{"providers": [{"name": "a", "execConfig": {"command": "c"}}]}`, wantErr: "apiVersion is empty"},
		{name: "a plugin that needs a terminal is refused", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c", "interactiveMode": "Always"}}]}`, wantErr: "needs a terminal"},
		{name: "a provider named twice is an error", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}}, {"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}}]}`, wantErr: "named twice"},
		{name: "an unknown args policy is an error", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}, "profileSourcedCLIArgsPolicy": "Prepend"}]}`, wantErr: "unknown profileSourcedCLIArgsPolicy"},
		{name: "an unknown env policy is an error", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}, "profileSourcedEnvVarsPolicy": "Merge"}]}`, wantErr: "unknown profileSourcedEnvVarsPolicy"},
		{name: "a variable a profile may set must be a variable name", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}, "profileSourcedEnvVarNames": ["A=B"]}]}`, wantErr: "not an environment variable name"},
		{name: "a profile may never be allowed to set the loader's variables", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}, "profileSourcedEnvVarNames": ["REGION", "LD_PRELOAD"]}]}`, wantErr: "LD_PRELOAD changes how programs are loaded"},
		{name: "a profile may never be allowed to set PATH", data: `{"providers": [{"name": "a", "execConfig": {"apiVersion": "v", "command": "c"}, "profileSourcedEnvVarNames": ["PATH"]}]}`, wantErr: "PATH changes how programs are loaded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseProviderFile([]byte(tc.data))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, p := range f.Providers {
				names = append(names, p.Name)
			}
			assert.Equal(t, tc.want, names)
		})
	}
}

func ext(name, raw string) clientcmdv1.NamedExtension {
	return clientcmdv1.NamedExtension{Name: name, Extension: runtime.RawExtension{Raw: []byte(raw)}}
}

func profile(name string, providers ...clusterinventory.AccessProvider) *clusterinventory.ClusterProfile {
	return &clusterinventory.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet"},
		Status:     clusterinventory.ClusterProfileStatus{AccessProviders: providers},
	}
}

func access(name, server string, exts ...clientcmdv1.NamedExtension) clusterinventory.AccessProvider {
	return clusterinventory.AccessProvider{Name: name, Cluster: clientcmdv1.Cluster{Server: server, CertificateAuthorityData: []byte("ca"), Extensions: exts}}
}

func TestMemberFromProfile(t *testing.T) {
	providers, err := ParseProviderFile([]byte(providerFileJSON))
	require.NoError(t, err)
	tests := []struct {
		name     string
		profile  *clusterinventory.ClusterProfile
		wantHost string
		check    func(t *testing.T, mc MemberConfig)
	}{
		{
			name:     "the operator's command reaches the profile's server",
			profile:  profile("c1", access("token", "https://127.0.0.1:1")),
			wantHost: "https://127.0.0.1:1",
			check: func(t *testing.T, mc MemberConfig) {
				require.NotNil(t, mc.rest.ExecProvider)
				assert.Equal(t, "/bin/token-plugin", mc.rest.ExecProvider.Command)
				assert.Equal(t, []byte("ca"), mc.rest.CAData)
				assert.Equal(t, "Never", string(mc.rest.ExecProvider.InteractiveMode))
			},
		},
		{
			name:     "the cluster's exec extension is handed to the plugin as its config",
			profile:  profile("c1", access("token", "https://127.0.0.1:1", ext(execExtension, `{"audience":"hub"}`))),
			wantHost: "https://127.0.0.1:1",
			check: func(t *testing.T, mc MemberConfig) {
				require.NotNil(t, mc.rest.ExecProvider.Config)
				raw, err := json.Marshal(mc.rest.ExecProvider.Config)
				require.NoError(t, err)
				assert.JSONEq(t, `{"audience":"hub"}`, string(raw))
				assert.True(t, mc.rest.ExecProvider.ProvideClusterInfo)
			},
		},
		{
			name: "the profile's args and envs are added as the operator's policies allow",
			profile: profile("c1", access("token", "https://127.0.0.1:1",
				ext(additionalArgsExtension, `["--cluster=c1"]`), ext(additionalEnvsExtension, `{"A":"profile","B":"profile"}`))),
			wantHost: "https://127.0.0.1:1",
			check: func(t *testing.T, mc MemberConfig) {
				assert.Equal(t, []string{"--x", "--cluster=c1"}, mc.rest.ExecProvider.Args)
				assert.Equal(t, "A=operator B=profile", envString(mc.rest.ExecProvider.Env))
			},
		},
		{
			name:     "the operator's order of providers decides which access is used",
			profile:  profile("c1", access("other", "https://127.0.0.1:2"), access("token", "https://127.0.0.1:1")),
			wantHost: "https://127.0.0.1:1",
		},
		{
			name:     "unknown access providers are skipped",
			profile:  profile("c1", access("oidc", "https://127.0.0.1:3"), access("other", "https://127.0.0.1:2")),
			wantHost: "https://127.0.0.1:2",
			check: func(t *testing.T, mc MemberConfig) {
				assert.Empty(t, mc.rest.ExecProvider.Args, "the other provider's policy ignores profile args")
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mc := memberFromProfile(tc.profile, providers)
			assert.NotEmpty(t, mc.fingerprint)
			require.NoError(t, mc.err)
			assert.Equal(t, tc.wantHost, mc.rest.Host)
			if tc.check != nil {
				tc.check(t, mc)
			}
		})
	}
}

func TestMemberFromProfileRefusesWhatItCannotUse(t *testing.T) {
	providers, err := ParseProviderFile([]byte(providerFileJSON))
	require.NoError(t, err)
	providers.Providers = append(providers.Providers, Provider{Name: "replace", ProfileSourcedEnvVarsPolicy: EnvsPolicyReplace,
		ExecConfig: &clientcmdv1.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/replace"}})
	tests := []struct {
		name    string
		profile *clusterinventory.ClusterProfile
		wantErr string
	}{
		{name: "a profile without access providers is an error", profile: profile("c1"), wantErr: "none of the profile's access providers (none)"},
		{name: "a profile with only unknown providers is an error", profile: profile("c1", access("oidc", "https://x")), wantErr: "(oidc) is in the provider file (token, other, replace)"},
		{name: "an access provider without a server is an error", profile: profile("c1", access("token", "")), wantErr: "has no cluster server"},
		{
			name:    "an access provider naming a CA file is refused",
			profile: profile("c1", clusterinventory.AccessProvider{Name: "token", Cluster: clientcmdv1.Cluster{Server: "https://x", CertificateAuthority: "/etc/passwd"}}),
			wantErr: "certificate-authority file",
		},
		{
			name:    "an access provider that skips TLS verification is refused",
			profile: profile("c1", clusterinventory.AccessProvider{Name: "token", Cluster: clientcmdv1.Cluster{Server: "https://x", InsecureSkipTLSVerify: true}}),
			wantErr: "skip TLS verification",
		},
		{name: "garbage args are an error, not a panic", profile: profile("c1", access("token", "https://x", ext(additionalArgsExtension, `{"a":`))), wantErr: "not a list of strings"},
		{name: "garbage envs are an error, not a panic", profile: profile("c1", access("token", "https://x", ext(additionalEnvsExtension, `[1,2]`))), wantErr: "not a map of strings"},
		{name: "a garbage server is an error, not a panic", profile: profile("c1", access("token", "::not a url\x00")), wantErr: "not an https URL"},
		{name: "a server without a scheme is an error", profile: profile("c1", access("token", "127.0.0.1:6443")), wantErr: "not an https URL"},
		{name: "a plaintext server is refused", profile: profile("c1", access("token", "http://127.0.0.1:6443")), wantErr: "not an https URL"},
		{
			name:    "a profile may not set a variable the provider does not list, LD_PRELOAD say",
			profile: profile("c1", access("token", "https://x", ext(additionalEnvsExtension, `{"B":"profile","LD_PRELOAD":"/tmp/evil.so"}`))),
			wantErr: `sets "LD_PRELOAD", which provider "token" does not let a profile set (its profileSourcedEnvVarNames: A, B)`,
		},
		{
			name:    "a provider that lists no variable lets a profile set none",
			profile: profile("c1", access("replace", "https://x", ext(additionalEnvsExtension, `{"HOME":"/tmp"}`))),
			wantErr: `sets "HOME", which provider "replace" does not let a profile set (its profileSourcedEnvVarNames: none)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mc := memberFromProfile(tc.profile, providers)
			assert.NotEmpty(t, mc.fingerprint, "an unusable profile has a fingerprint too, so that it is reported once")
			assert.NotContains(t, fmt.Sprint(mc.err), "/tmp/evil.so", "values are never quoted")
			require.Error(t, mc.err)
			assert.Contains(t, mc.err.Error(), tc.wantErr)
			assert.Nil(t, mc.rest)
		})
	}
	assert.Contains(t, memberFromProfile(profile("c1", access("token", "https://x")), nil).err.Error(), "no usable provider file")
}

func TestProfileFingerprintFollowsTheDerivedConfig(t *testing.T) {
	providers, err := ParseProviderFile([]byte(providerFileJSON))
	require.NoError(t, err)
	base := memberFromProfile(profile("c1", access("token", "https://127.0.0.1:1", ext(execExtension, `{"v":1}`))), providers)
	same := memberFromProfile(profile("c1", access("token", "https://127.0.0.1:1", ext(execExtension, `{"v":1}`))), providers)
	rotated := memberFromProfile(profile("c1", access("token", "https://127.0.0.1:1", ext(execExtension, `{"v":2}`))), providers)
	moved := memberFromProfile(profile("c1", access("token", "https://127.0.0.1:9", ext(execExtension, `{"v":1}`))), providers)
	other, err := ParseProviderFile([]byte(`{"providers": [{"name": "token", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/new"}}]}`))
	require.NoError(t, err)
	newCommand := memberFromProfile(profile("c1", access("token", "https://127.0.0.1:1", ext(execExtension, `{"v":1}`))), other)
	unhealthy := profile("c1", access("token", "https://127.0.0.1:1", ext(execExtension, `{"v":1}`)))
	unhealthy.Status.Conditions = []metav1.Condition{{Type: clusterinventory.ConditionControlPlaneHealthy, Status: metav1.ConditionFalse}}
	unhealthy.Status.Properties = []clusterinventory.Property{{Name: "region", Value: "eu"}}
	assert.Equal(t, base.fingerprint, memberFromProfile(unhealthy, providers).fingerprint, "conditions and properties are no access data: no reconnection")
	assert.Equal(t, base.fingerprint, same.fingerprint)
	assert.NotEqual(t, base.fingerprint, rotated.fingerprint, "new extension data rotates the member")
	assert.NotEqual(t, base.fingerprint, moved.fingerprint, "a new server rotates the member")
	assert.NotEqual(t, base.fingerprint, newCommand.fingerprint, "a new provider rotates the member")
}

func TestProfileMembers(t *testing.T) {
	providers, err := ParseProviderFile([]byte(providerFileJSON))
	require.NoError(t, err)
	st := newProfileState()
	healthy := profile("c1", access("token", "https://127.0.0.1:1"))
	healthy.Status.Conditions = []metav1.Condition{{Type: clusterinventory.ConditionControlPlaneHealthy, Status: metav1.ConditionFalse}}
	profiles := []*clusterinventory.ClusterProfile{
		healthy, // first, and stays first: the caller's slice is not reordered
		profile("Not_A_Name", access("token", "https://127.0.0.1:2")),
		profile("c3", access("oidc", "https://127.0.0.1:3")),
	}
	members := st.members(klog.Background(), profiles, providers)
	assert.Len(t, members, 2, "an invalid name is skipped")
	assert.NoError(t, members["c1"].err, "an unhealthy control plane does not drop the member")
	assert.Error(t, members["c3"].err)
	assert.Equal(t, map[string]string{"c1": "False", "Not_A_Name": "Unknown", "c3": "Unknown"}, st.health)
	assert.Len(t, st.problems, 2)

	members = st.members(klog.Background(), profiles[:1], nil)
	assert.Contains(t, members["c1"].err.Error(), "no usable provider file")
	assert.Len(t, st.problems, 1, "problems of profiles gone are forgotten")
}

func TestProviderFileWatchKeepsTheLastGoodFile(t *testing.T) {
	path := t.TempDir() + "/providers.json"
	w := &providerFileWatch{path: path}
	assert.False(t, w.read(t.Context()), "a missing file is no change")
	assert.Nil(t, w.get())
	require.NoError(t, os.WriteFile(path, []byte(providerFileJSON), 0o600))
	assert.True(t, w.read(t.Context()))
	assert.False(t, w.read(t.Context()), "the same file is no change")
	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o600))
	assert.False(t, w.read(t.Context()))
	require.NotNil(t, w.get(), "a file that turns bad keeps the providers in use")
	assert.Len(t, w.get().Providers, 2)
}

func envString(env []clientcmdapi.ExecEnvVar) string {
	s := ""
	for i, e := range env {
		if i > 0 {
			s += " "
		}
		s += e.Name + "=" + e.Value
	}
	return s
}

// The check of what client-go resolved backs the checks of the profile: a
// plugin that is not the provider's, or a variable it does not allow, is
// refused however it got there.
func TestOperatorPlugin(t *testing.T) {
	provider := &Provider{Name: "token", ProfileSourcedEnvVarNames: []string{"REGION"},
		ExecConfig: &clientcmdv1.ExecConfig{Command: "/bin/token-plugin", Env: []clientcmdv1.ExecEnvVar{{Name: "OPERATOR", Value: "x"}}}}
	check := operatorPlugin(provider)
	assert.NoError(t, check(&clientcmdapi.ExecConfig{Command: "/bin/token-plugin", Env: []clientcmdapi.ExecEnvVar{{Name: "OPERATOR"}, {Name: "REGION"}}}))
	assert.ErrorContains(t, check(&clientcmdapi.ExecConfig{Command: "/bin/sh"}), `not provider "token"'s`)
	assert.ErrorContains(t, check(&clientcmdapi.ExecConfig{Command: "/bin/token-plugin", Env: []clientcmdapi.ExecEnvVar{{Name: "LD_PRELOAD"}}}), `gets "LD_PRELOAD"`)
}
