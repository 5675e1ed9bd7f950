// Command mci-conformance runs the InferencePoolImport conformance suite
// (package conformance) against the clusters of a kubeconfig's contexts and
// writes its report; docs/conformance.md says how.
package main

import (
	"os"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"github.com/mci-dev/mci/cmd/mci-conformance/app"
)

func main() {
	cmd := app.NewCommand(app.NewOptions())
	// SIGTERM and SIGINT end the context: the running test stops waiting,
	// cleans up, and the rest are reported as not run.
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}
