package clusterset

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// hostileKubeconfigs are kubeconfigs a Secret's writer could try: plugins
// and files under every name client-go may pick, TLS weakened, plaintext.
func hostileKubeconfigs(file string) []string {
	const exec = `{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "touch /tmp/pwned"], interactiveMode: Never}}`
	return []string{
		string(kubeconfigFor("https://127.0.0.1:6443")),
		"apiVersion: v1\nkind: Config\nclusters: [{name: \"\", cluster: {server: \"https://a\"}}]\nusers: [{name: \"\", user: " + exec + "}]\n",
		"apiVersion: v1\nkind: Config\nclusters: [{name: \"\", cluster: {server: \"https://a\"}}]\nusers: [{name: \"\", user: {tokenFile: " + file + "}}]\n",
		"apiVersion: v1\nkind: Config\ncurrent-context: \"\"\ncontexts: [{name: \"\", context: {}}]\nclusters: [{name: \"\", cluster: {server: \"https://a\", certificate-authority: " + file + "}}]\nusers: [{name: \"\", user: {token: t}}]\n",
		"apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: \"https://a\", insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: t}}, {name: \"\", user: " + exec + "}]\n",
		"apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: \"http://a\"}}]\nusers: [{name: u, user: {auth-provider: {name: oidc}}}]\n",
		"apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: \"https://a\", proxy-url: \"socks5://127.0.0.1:1\"}}]\nusers: [{name: u, user: {client-certificate: " + file + ", client-key: " + file + "}}]\n",
		`{"apiVersion":"v1","kind":"Config","clusters":[{"name":"","cluster":{"server":"a:1","certificate-authority-data":"Y2E="}}],"users":[{"name":"","user":{"token":"t"}}]}`,
		"",
		"\x00\x01{not yaml",
	}
}

// tokenFileOf is a file a hostile kubeconfig may name: it must exist, or
// client-go refuses the kubeconfig before the checks under test matter.
func tokenFileOf(f *testing.F) string {
	path := filepath.Join(f.TempDir(), "token")
	if err := os.WriteFile(path, []byte("local-secret"), 0o600); err != nil {
		f.Fatal(err)
	}
	return path
}

// runsOrReadsLocal says what in a resolved configuration would run or read
// anything on the server, or send a request without verified TLS.
func runsOrReadsLocal(rc *rest.Config) []string { return resolvedProblems(rc, nil) }

func FuzzParseMemberKubeconfig(f *testing.F) {
	for _, k := range hostileKubeconfigs(tokenFileOf(f)) {
		f.Add([]byte(k))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mc := ParseMemberKubeconfig(data)
		if mc.fingerprint == "" {
			t.Fatal("no fingerprint")
		}
		if (mc.err == nil) == (mc.rest == nil) {
			t.Fatalf("err %v with rest %v", mc.err, mc.rest)
		}
	})
}

// The property that matters: no kubeconfig a Secret may hold is accepted
// and then, as client-go resolves it on its own from the same bytes, runs
// or reads anything local, or talks without verified TLS.
func FuzzParseSecretKubeconfig(f *testing.F) {
	for _, k := range hostileKubeconfigs(tokenFileOf(f)) {
		f.Add([]byte(k))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mc := parseSecretKubeconfig(data)
		if mc.fingerprint == "" {
			t.Fatal("no fingerprint")
		}
		if (mc.err == nil) == (mc.rest == nil) {
			t.Fatalf("err %v with rest %v", mc.err, mc.rest)
		}
		if mc.err != nil {
			if strings.Contains(mc.err.Error(), "local-secret") {
				t.Fatalf("the error quotes a local file's content: %v", mc.err)
			}
			return
		}
		if p := runsOrReadsLocal(mc.rest); len(p) > 0 {
			t.Fatalf("accepted, and the config it made %s", strings.Join(p, "; "))
		}
		rc, err := clientcmd.RESTConfigFromKubeConfig(data)
		if err != nil {
			t.Fatalf("accepted, but client-go cannot resolve it: %v", err)
		}
		if p := runsOrReadsLocal(rc); len(p) > 0 {
			t.Fatalf("accepted, and client-go resolves it to a config that %s", strings.Join(p, "; "))
		}
	})
}

// The same property over kubeconfigs built field by field, which reach the
// shapes random bytes seldom do: any names (the empty one included), any
// current context, and each local or unsafe field on or off.
func FuzzSecretKubeconfigRunsOrReadsNothingLocal(f *testing.F) {
	file := tokenFileOf(f)
	f.Add("c", "u", "c", "c", "https://a", uint16(0))
	f.Add("", "", "", "", "https://a", uint16(1))       // exec, names empty
	f.Add("", "", "", "", "https://a", uint16(2))       // tokenFile, names empty
	f.Add("c", "u", "x", "x", "https://a", uint16(4))   // CA file, dangling context
	f.Add("c", "", "c", "", "http://a", uint16(8|16))   // cert files, plaintext
	f.Add("c", "u", "c", "c", "a:1", uint16(32|64))     // insecure, auth provider
	f.Add("c", "u", "c", "c", "https://a", uint16(128)) // a second, unused user with exec
	f.Add("c", "u", "c", "c", "https://a", uint16(256)) // proxy
	f.Fuzz(func(t *testing.T, cluster, user, context, current, server string, fields uint16) {
		cfg := clientcmdapi.NewConfig()
		c := &clientcmdapi.Cluster{Server: server}
		u := &clientcmdapi.AuthInfo{Token: "t"}
		exec := &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
		if fields&1 != 0 {
			u.Exec = exec
		}
		if fields&2 != 0 {
			u.Token, u.TokenFile = "", file
		}
		if fields&4 != 0 {
			c.CertificateAuthority = file
		}
		if fields&8 != 0 {
			u.ClientCertificate, u.ClientKey = file, file
		}
		if fields&16 != 0 {
			c.CertificateAuthorityData = []byte("ca")
		}
		if fields&32 != 0 {
			c.InsecureSkipTLSVerify = true
		}
		if fields&64 != 0 {
			u.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}
		if fields&128 != 0 {
			cfg.AuthInfos[user+"-spare"] = &clientcmdapi.AuthInfo{Exec: exec}
		}
		if fields&256 != 0 {
			c.ProxyURL = "http://127.0.0.1:3128"
		}
		cfg.Clusters[cluster] = c
		cfg.AuthInfos[user] = u
		if fields&512 == 0 {
			cfg.Contexts[context] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
		}
		cfg.CurrentContext = current
		data, err := clientcmd.Write(*cfg)
		if err != nil {
			return // not a kubeconfig: nothing to accept
		}
		mc := parseSecretKubeconfig(data)
		if mc.err != nil {
			return
		}
		rc, err := clientcmd.RESTConfigFromKubeConfig(data)
		if err != nil {
			t.Fatalf("accepted, but client-go cannot resolve it: %v", err)
		}
		if p := runsOrReadsLocal(rc); len(p) > 0 {
			t.Fatalf("accepted, and client-go resolves it to a config that %s", strings.Join(p, "; "))
		}
	})
}

// selfContained alone, before anything is resolved, keeps every plugin and
// file out whichever entries client-go then picks: what it accepts never
// resolves to a config that runs or reads anything local (TLS aside, which
// the resolved check decides).
func FuzzSelfContained(f *testing.F) {
	for _, k := range hostileKubeconfigs(tokenFileOf(f)) {
		f.Add([]byte(k), "")
	}
	f.Add(kubeconfigFor("https://a"), "c")
	f.Fuzz(func(t *testing.T, data []byte, context string) {
		cfg, err := clientcmd.Load(data)
		if err != nil {
			return
		}
		if selfContained(cfg) != nil {
			return
		}
		overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
		rc, err := clientcmd.NewDefaultClientConfig(*cfg, overrides).ClientConfig()
		if err != nil {
			return
		}
		if rc.ExecProvider != nil || rc.AuthProvider != nil || rc.BearerTokenFile != "" || rc.CAFile != "" || rc.CertFile != "" || rc.KeyFile != "" || rc.Insecure {
			t.Fatalf("self-contained, yet resolved to a config that runs or reads something local: %+v", rc)
		}
	})
}
