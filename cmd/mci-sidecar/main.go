// Command mci-sidecar runs next to an Inference Gateway (Envoy) as its
// ext_proc server and routes each inference request to a cluster of the
// ClusterSet: through that cluster's Endpoint Picker, or to its parent
// gateway (see pkg/sidecar).
package main

import (
	"os"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"github.com/mci-dev/mci/cmd/mci-sidecar/app"
)

func main() {
	cmd := app.NewCommand(app.NewOptions())
	// SIGTERM and SIGINT end the context, which drains the servers.
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}
