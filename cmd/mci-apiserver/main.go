// Command mci-apiserver is the aggregated API server that serves
// InferencePoolImports (and InferencePoolExports) computed from every
// member of a ClusterSet.
package main

import (
	"os"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"github.com/mci-dev/mci/cmd/mci-apiserver/app"
)

func main() {
	cmd := app.NewCommand(app.NewOptions())
	// SIGTERM and SIGINT end the context, which drains the server.
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}
