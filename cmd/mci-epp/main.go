// Command mci-epp is mci's reference Endpoint Picker for one InferencePool:
// an Envoy ext_proc server that picks a model server for each inference
// request (see pkg/epp).
package main

import (
	"os"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"github.com/mci-dev/mci/cmd/mci-epp/app"
)

func main() {
	cmd := app.NewCommand(app.NewOptions())
	// SIGTERM and SIGINT end the context, which drains the servers.
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}
