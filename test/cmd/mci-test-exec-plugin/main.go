// Command mci-test-exec-plugin is a client-go exec credential plugin for
// the e2e tests of ClusterProfile membership. It hands out a bearer token
// read from the file that its cluster's config names, which client-go
// passes in KUBERNETES_EXEC_INFO from the cluster entry's
// client.authentication.k8s.io/exec extension (provideClusterInfo), and
// appends what it was given to $MCI_TEST_EXEC_PLUGIN_LOG so that a test
// can check what reached it.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// execInfo is the part of the ExecCredential client-go hands over that
// the plugin reads.
type execInfo struct {
	APIVersion string `json:"apiVersion"`
	Spec       struct {
		Cluster *struct {
			Server string          `json:"server"`
			Config json.RawMessage `json:"config"`
		} `json:"cluster"`
	} `json:"spec"`
}

// clusterConfig is what the tests put in the exec extension.
type clusterConfig struct {
	TokenFile string `json:"tokenFile"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mci-test-exec-plugin:", err)
		os.Exit(1)
	}
}

func run() error {
	raw := os.Getenv("KUBERNETES_EXEC_INFO")
	var info execInfo
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return fmt.Errorf("KUBERNETES_EXEC_INFO: %w", err)
	}
	if info.Spec.Cluster == nil {
		return fmt.Errorf("KUBERNETES_EXEC_INFO has no cluster: provideClusterInfo is off")
	}
	var cfg clusterConfig
	if err := json.Unmarshal(info.Spec.Cluster.Config, &cfg); err != nil || cfg.TokenFile == "" {
		return fmt.Errorf("the cluster's exec extension names no tokenFile: %s", info.Spec.Cluster.Config)
	}
	if err := record(info, os.Args[1:]); err != nil {
		return err
	}
	token, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		return err
	}
	out := map[string]any{
		"apiVersion": info.APIVersion,
		"kind":       "ExecCredential",
		"status":     map[string]any{"token": strings.TrimSpace(string(token))},
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// record appends one JSON line per call: the server, the cluster config,
// the arguments the plugin was started with and the variable a profile's
// additional-envs extension may set.
func record(info execInfo, args []string) error {
	path := os.Getenv("MCI_TEST_EXEC_PLUGIN_LOG")
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	line, err := json.Marshal(map[string]any{
		"server":      info.Spec.Cluster.Server,
		"config":      info.Spec.Cluster.Config,
		"args":        args,
		"fromProfile": os.Getenv("E2E_FROM_PROFILE"),
	})
	if err != nil {
		return err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
