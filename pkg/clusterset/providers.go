package clusterset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"

	clusterinventory "github.com/mci-dev/mci/pkg/apis/clusterinventory/v1alpha1"
)

// Extensions of a ClusterProfile's access provider cluster entry that
// KEP-5339 reserves: the first is client-go's own (handed to the exec
// plugin as its cluster's config), the others add arguments and
// environment variables to the operator's command when the operator's
// provider file allows it.
const (
	execExtension           = "client.authentication.k8s.io/exec"
	additionalArgsExtension = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args"
	additionalEnvsExtension = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs"
)

// How a provider treats the arguments and environment variables a
// profile adds (KEP-5339); the empty policy ignores them.
const (
	ArgsPolicyIgnore          = "Ignore"
	ArgsPolicyAppend          = "Append"
	EnvsPolicyIgnore          = "Ignore"
	EnvsPolicyAppendIfMissing = "AppendIfNotExists"
	EnvsPolicyReplace         = "Replace"
)

// ProviderFile is the operator's provider file of KEP-5339: which exec
// credential plugin provides the credentials of each kind of access
// provider a ClusterProfile may offer. It is the only place a command to
// run comes from: a profile names a provider and gives connection data,
// never a command.
type ProviderFile struct {
	Providers []Provider `json:"providers"`
}

// Provider is one entry of the provider file. ExecConfig has the shape of
// a kubeconfig user's exec entry.
type Provider struct {
	Name                        string                  `json:"name"`
	ExecConfig                  *clientcmdv1.ExecConfig `json:"execConfig"`
	ProfileSourcedCLIArgsPolicy string                  `json:"profileSourcedCLIArgsPolicy,omitempty"`
	ProfileSourcedEnvVarsPolicy string                  `json:"profileSourcedEnvVarsPolicy,omitempty"`
	// ProfileSourcedEnvVarNames are the environment variables a profile
	// may set for the plugin, when ProfileSourcedEnvVarsPolicy lets it set
	// any: an mci addition to KEP-5339. A profile that sets another is
	// refused. Whoever writes ClusterProfiles must not choose how the
	// plugin, a program running as mci-apiserver, is loaded or configured
	// (LD_PRELOAD, a config file that names a helper command, ...): only
	// names the operator lists pass, none by default.
	ProfileSourcedEnvVarNames []string `json:"profileSourcedEnvVarNames,omitempty"`
}

// ParseProviderFile reads a provider file, JSON or YAML, and checks what a
// server needs of it: named providers, each with a command and an exec
// API version, and no plugin that must talk to a terminal.
func ParseProviderFile(data []byte) (*ProviderFile, error) {
	var f ProviderFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("invalid provider file: %w", err)
	}
	if len(f.Providers) == 0 {
		return nil, fmt.Errorf("invalid provider file: no providers")
	}
	seen := map[string]bool{}
	for i, p := range f.Providers {
		if err := checkProvider(p); err != nil {
			return nil, fmt.Errorf("invalid provider file: providers[%d]: %w", i, err)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("invalid provider file: provider %q is named twice", p.Name)
		}
		seen[p.Name] = true
	}
	return &f, nil
}

func checkProvider(p Provider) error {
	switch {
	case p.Name == "":
		return fmt.Errorf("name is empty")
	case p.ExecConfig == nil:
		return fmt.Errorf("provider %q has no execConfig", p.Name)
	case p.ExecConfig.Command == "":
		return fmt.Errorf("provider %q: execConfig.command is empty", p.Name)
	case p.ExecConfig.APIVersion == "":
		return fmt.Errorf("provider %q: execConfig.apiVersion is empty (client.authentication.k8s.io/v1, say)", p.Name)
	case p.ExecConfig.InteractiveMode == clientcmdv1.AlwaysExecInteractiveMode:
		return fmt.Errorf("provider %q: execConfig.interactiveMode Always needs a terminal, which a server does not have", p.Name)
	}
	if !slices.Contains([]string{"", ArgsPolicyIgnore, ArgsPolicyAppend}, p.ProfileSourcedCLIArgsPolicy) {
		return fmt.Errorf("provider %q: unknown profileSourcedCLIArgsPolicy %q", p.Name, p.ProfileSourcedCLIArgsPolicy)
	}
	if !slices.Contains([]string{"", EnvsPolicyIgnore, EnvsPolicyAppendIfMissing, EnvsPolicyReplace}, p.ProfileSourcedEnvVarsPolicy) {
		return fmt.Errorf("provider %q: unknown profileSourcedEnvVarsPolicy %q", p.Name, p.ProfileSourcedEnvVarsPolicy)
	}
	for _, name := range p.ProfileSourcedEnvVarNames {
		if !envName.MatchString(name) {
			return fmt.Errorf("provider %q: profileSourcedEnvVarNames: %q is not an environment variable name", p.Name, name)
		}
		if startsProgram(name) {
			return fmt.Errorf("provider %q: profileSourcedEnvVarNames: %s changes how programs are loaded or started; a profile may never set it", p.Name, name)
		}
	}
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// startsProgram says whether a variable changes how any program, or the
// interpreter a plugin may be written for, loads code or starts: a guard
// against an operator listing one in profileSourcedEnvVarNames by mistake.
// It cannot be complete (a plugin's own variables may name helper
// commands too), which is why profiles set only the names listed.
func startsProgram(name string) bool {
	if strings.HasPrefix(name, "LD_") || strings.HasPrefix(name, "DYLD_") {
		return true
	}
	switch name {
	case "PATH", "GCONV_PATH", "BASH_ENV", "ENV", "NODE_OPTIONS",
		"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PERL5LIB", "PERL5OPT",
		"RUBYLIB", "RUBYOPT", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS":
		return true
	}
	return false
}

// accessFor picks how to reach a profile's cluster: the operator's
// providers in the file's order, the first the profile offers, as the
// upstream access library does, so that the operator, not the profile's
// writer, says which credentials are preferred. The deprecated
// credentialProviders are read too; an accessProviders entry of the same
// name wins.
func (f *ProviderFile) accessFor(p *clusterinventory.ClusterProfile) (*clusterinventory.AccessProvider, *Provider) {
	offered := map[string]*clusterinventory.AccessProvider{}
	for _, list := range [][]clusterinventory.AccessProvider{p.Status.CredentialProviders, p.Status.AccessProviders} {
		for i := range list {
			offered[list[i].Name] = &list[i]
		}
	}
	for i := range f.Providers {
		if ap, ok := offered[f.Providers[i].Name]; ok {
			return ap, &f.Providers[i]
		}
	}
	return nil, nil
}

// profileKubeconfig is the kubeconfig that reaches a profile's cluster:
// the cluster entry of the chosen access provider as the profile gives it
// (server, CA, extensions), and a user whose exec plugin is the operator's.
// client-go then does the rest as for any kubeconfig, handing the
// cluster's client.authentication.k8s.io/exec extension to the plugin.
func profileKubeconfig(p *clusterinventory.ClusterProfile, f *ProviderFile) (*clientcmdv1.Config, error) {
	ap, provider := f.accessFor(p)
	if ap == nil {
		return nil, fmt.Errorf("none of the profile's access providers (%s) is in the provider file (%s)", offeredNames(p), providerNames(f))
	}
	cluster := ap.Cluster.DeepCopy()
	switch {
	case cluster.Server == "":
		return nil, fmt.Errorf("access provider %q has no cluster server", ap.Name)
	case !validServer(cluster.Server):
		// Plaintext would let anyone on the path forge the member's data,
		// and client-go would not even run the plugin for it.
		return nil, fmt.Errorf("access provider %q: cluster server %q is not an https URL with a host", ap.Name, cluster.Server)
	case cluster.CertificateAuthority != "":
		// A profile must not make the server read one of its own files.
		return nil, fmt.Errorf("access provider %q names a certificate-authority file; a profile must inline it as certificate-authority-data", ap.Name)
	case cluster.InsecureSkipTLSVerify:
		// The plugin's credentials would go to whoever answers.
		return nil, fmt.Errorf("access provider %q asks to skip TLS verification; give the cluster's certificate-authority-data instead", ap.Name)
	}
	exec := provider.ExecConfig.DeepCopy()
	exec.InteractiveMode = clientcmdv1.NeverExecInteractiveMode
	if err := addProfileArgsAndEnvs(exec, cluster.Extensions, provider); err != nil {
		return nil, fmt.Errorf("access provider %q: %w", ap.Name, err)
	}
	return &clientcmdv1.Config{
		Kind:           "Config",
		APIVersion:     "v1",
		Clusters:       []clientcmdv1.NamedCluster{{Name: p.Name, Cluster: *cluster}},
		AuthInfos:      []clientcmdv1.NamedAuthInfo{{Name: provider.Name, AuthInfo: clientcmdv1.AuthInfo{Exec: exec}}},
		Contexts:       []clientcmdv1.NamedContext{{Name: p.Name, Context: clientcmdv1.Context{Cluster: p.Name, AuthInfo: provider.Name}}},
		CurrentContext: p.Name,
	}, nil
}

// addProfileArgsAndEnvs applies the KEP-5339 extensions that add arguments
// and environment variables, as far as the provider's policies allow.
func addProfileArgsAndEnvs(exec *clientcmdv1.ExecConfig, exts []clientcmdv1.NamedExtension, provider *Provider) error {
	for _, ext := range exts {
		switch {
		case ext.Name == additionalArgsExtension && provider.ProfileSourcedCLIArgsPolicy == ArgsPolicyAppend:
			var args []string
			if err := yaml.Unmarshal(ext.Extension.Raw, &args); err != nil {
				return fmt.Errorf("extension %s is not a list of strings: %w", ext.Name, err)
			}
			exec.Args = append(exec.Args, args...)
		case ext.Name == additionalEnvsExtension && (provider.ProfileSourcedEnvVarsPolicy == EnvsPolicyAppendIfMissing || provider.ProfileSourcedEnvVarsPolicy == EnvsPolicyReplace):
			var envs map[string]string
			if err := yaml.Unmarshal(ext.Extension.Raw, &envs); err != nil {
				return fmt.Errorf("extension %s is not a map of strings: %w", ext.Name, err)
			}
			for _, name := range slices.Sorted(maps.Keys(envs)) {
				if !slices.Contains(provider.ProfileSourcedEnvVarNames, name) {
					return fmt.Errorf("extension %s sets %q, which provider %q does not let a profile set (its profileSourcedEnvVarNames: %s)", ext.Name, name, provider.Name, namesOrNone(provider.ProfileSourcedEnvVarNames))
				}
			}
			exec.Env = mergeEnv(exec.Env, envs, provider.ProfileSourcedEnvVarsPolicy == EnvsPolicyReplace)
		}
	}
	return nil
}

// mergeEnv adds the profile's variables to the operator's: the operator's
// value wins a name both give unless profileWins. The result is sorted so
// that the same inputs make the same kubeconfig.
func mergeEnv(operator []clientcmdv1.ExecEnvVar, profile map[string]string, profileWins bool) []clientcmdv1.ExecEnvVar {
	merged := map[string]string{}
	for name, value := range profile {
		merged[name] = value
	}
	for _, e := range operator {
		if _, both := merged[e.Name]; !both || !profileWins {
			merged[e.Name] = e.Value
		}
	}
	out := make([]clientcmdv1.ExecEnvVar, 0, len(merged))
	for name, value := range merged {
		out = append(out, clientcmdv1.ExecEnvVar{Name: name, Value: value})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// memberFromProfile is the member a profile describes. Its fingerprint is
// that of the derived kubeconfig, so that a change of the profile's
// connection data or of the operator's provider reconnects the member.
func memberFromProfile(p *clusterinventory.ClusterProfile, f *ProviderFile) MemberConfig {
	if f == nil {
		return MemberConfig{fingerprint: "no-provider-file", err: fmt.Errorf("no usable provider file")}
	}
	kc, err := profileKubeconfig(p, f)
	if err != nil {
		return MemberConfig{fingerprint: fingerprintOf([]byte(err.Error())), err: err}
	}
	data, err := json.Marshal(kc)
	if err != nil {
		return MemberConfig{fingerprint: fingerprintOf([]byte(err.Error())), err: fmt.Errorf("encoding the profile's kubeconfig: %w", err)}
	}
	mc := ParseMemberKubeconfig(data)
	if mc.err != nil {
		return mc
	}
	// What client-go resolved decides, as for a Secret, except that the
	// plugin is the operator's, with the variables the operator allows.
	_, provider := f.accessFor(p)
	if problems := resolvedProblems(mc.rest, operatorPlugin(provider)); len(problems) > 0 {
		mc.rest, mc.err = nil, fmt.Errorf("the profile's access resolves to what a profile may not ask for: %s", strings.Join(problems, "; "))
	}
	return mc
}

// operatorPlugin accepts the provider's own exec plugin only, with no
// environment variable but the operator's and those it lets profiles set.
func operatorPlugin(provider *Provider) func(*clientcmdapi.ExecConfig) error {
	return func(exec *clientcmdapi.ExecConfig) error {
		if exec.Command != provider.ExecConfig.Command {
			return fmt.Errorf("the exec plugin is not provider %q's", provider.Name)
		}
		for _, e := range exec.Env {
			operators := slices.ContainsFunc(provider.ExecConfig.Env, func(o clientcmdv1.ExecEnvVar) bool { return o.Name == e.Name })
			if !operators && !slices.Contains(provider.ProfileSourcedEnvVarNames, e.Name) {
				return fmt.Errorf("the exec plugin gets %q, which provider %q does not let a profile set", e.Name, provider.Name)
			}
		}
		return nil
	}
}

func namesOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func offeredNames(p *clusterinventory.ClusterProfile) string {
	var names []string
	for _, list := range [][]clusterinventory.AccessProvider{p.Status.AccessProviders, p.Status.CredentialProviders} {
		for _, ap := range list {
			names = append(names, ap.Name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func providerNames(f *ProviderFile) string {
	names := make([]string, 0, len(f.Providers))
	for _, p := range f.Providers {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// fingerprintOf names what a source derived a member from, as
// ParseMemberKubeconfig does.
func fingerprintOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func validServer(server string) bool {
	u, err := url.Parse(server)
	return err == nil && u.Scheme == "https" && u.Host != ""
}
