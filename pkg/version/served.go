package version

import (
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	basecompatibility "k8s.io/component-base/compatibility"
)

// Served wraps the effective version of a generic API server so that its
// /version answers with this build of mci, as a Kubernetes server answers
// with its own build. Everything else, the binary and emulation versions
// that gate the generic server's Kubernetes features and APIs among it,
// stays that of kube, the Kubernetes libraries mci is built with.
func Served(kube basecompatibility.EffectiveVersion) basecompatibility.EffectiveVersion {
	return servedVersion{EffectiveVersion: kube}
}

type servedVersion struct {
	basecompatibility.EffectiveVersion
}

// Info is what the generic server serves at /version.
func (servedVersion) Info() *apimachineryversion.Info {
	info := Get()
	return &info
}
