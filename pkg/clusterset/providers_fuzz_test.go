package clusterset

import (
	"testing"

	"k8s.io/client-go/rest"
)

// A provider file is the operator's, but a typo must be an error, never a
// crash of the server.
//
// Trusted input: the operator's ClusterProfile provider file (whoever
// writes it chooses the commands mci-apiserver runs).
func FuzzParseProviderFile(f *testing.F) {
	f.Add([]byte(providerFileJSON))
	f.Add([]byte("providers:\n- name: a\n  execConfig: {command: c, apiVersion: v}\n"))
	f.Add([]byte(`{"providers": [{"name": "a", "execConfig": null}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ParseProviderFile(data)
		if err == nil && len(file.Providers) == 0 {
			t.Fatal("a file without providers was accepted")
		}
	})
}

// Whoever writes ClusterProfiles on the hub controls the server, the CA
// and the extensions: none of them may crash the server.
func FuzzMemberFromProfile(f *testing.F) {
	providers, err := ParseProviderFile([]byte(providerFileJSON))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("https://127.0.0.1:1", []byte(`{"a":1}`), []byte(`["--x"]`), []byte(`{"A":"b"}`))
	f.Add("::", []byte(`null`), []byte(`{`), []byte(`[1]`))
	f.Add("http://127.0.0.1:1", []byte(`{}`), []byte(`[]`), []byte(`{"A":"b"}`))
	f.Add("https://127.0.0.1:1", []byte(`{}`), []byte(`[]`), []byte(`{"LD_PRELOAD":"/tmp/x.so","B":"c"}`))
	f.Add("127.0.0.1:1", []byte(`{}`), []byte(`[]`), []byte(`{"PATH":"/tmp"}`))
	f.Fuzz(func(t *testing.T, server string, execData, args, envs []byte) {
		p := profile("c1", access("token", server,
			ext(execExtension, string(execData)), ext(additionalArgsExtension, string(args)), ext(additionalEnvsExtension, string(envs))))
		mc := memberFromProfile(p, providers)
		if mc.fingerprint == "" {
			t.Fatal("no fingerprint")
		}
		if (mc.err == nil) == (mc.rest == nil) {
			t.Fatalf("err %v with rest %v", mc.err, mc.rest)
		}
		if mc.err != nil {
			return
		}
		// Accepted: the operator's plugin, with the operator's variables
		// and those it lets profiles set, over verified TLS.
		if !rest.IsConfigTransportTLS(*mc.rest) || mc.rest.Insecure {
			t.Fatalf("accepted a profile reached without verified TLS: %q", mc.rest.Host)
		}
		if mc.rest.ExecProvider == nil || mc.rest.ExecProvider.Command != "/bin/token-plugin" {
			t.Fatalf("accepted a profile whose plugin is not the operator's: %+v", mc.rest.ExecProvider)
		}
		for _, e := range mc.rest.ExecProvider.Env {
			if e.Name != "A" && e.Name != "B" {
				t.Fatalf("accepted a profile that sets %q for the plugin", e.Name)
			}
		}
	})
}
