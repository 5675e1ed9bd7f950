#!/usr/bin/env bash
# Builds the kube-apiserver, kube-controller-manager and etcd that the local
# ClusterSet runs, from the tools modules under hack/tools, into _output/bin.
# A build happens once per pinned version (build_tool in lib.sh): a stamp
# file next to each binary records the version it was built from, and later
# runs only check it.
#
# The first kube-apiserver build compiles most of k8s.io/kubernetes: several
# minutes on a 2-core machine. kube-controller-manager comes from the same
# module and shares most of those packages, so it follows in a few minutes
# more. Later builds (e.g. after a version bump of a dependency) reuse Go's
# build cache.
#
#   hack/build-kube-tools.sh           the newest Kubernetes, which make test
#                                      runs (hack/tools/kube-apiserver)
#   hack/build-kube-tools.sh --compat  the oldest minor the chart claims
#                                      (hack/tools/kube-apiserver-compat)
#                                      into _output/compat/bin, beside links
#                                      to everything else of _output/bin
#                                      (etcd, mci's binaries, the test
#                                      programs): make test-compat's bin dir
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

KUBE_DIR="${REPO_ROOT}/hack/tools/kube-apiserver"
case "${1:-}" in
  "") ;;
  --compat)
    KUBE_DIR="${REPO_ROOT}/hack/tools/kube-apiserver-compat"
    MAIN_BIN="${OUTPUT_BIN}"
    OUTPUT_BIN="${REPO_ROOT}/_output/compat/bin"
    mkdir -p "${OUTPUT_BIN}"
    ;;
  *) echo "usage: $0 [--compat]" >&2; exit 2 ;;
esac

# Two `make run`s started together must not both build (or one read the
# other's half-written binary): serialise on a lock when flock is available.
if command -v flock >/dev/null 2>&1 && [[ -z "${MCI_KUBE_TOOLS_LOCKED:-}" ]]; then
  exec env MCI_KUBE_TOOLS_LOCKED=1 flock "${OUTPUT_BIN}/.kube-tools.lock" "$0" "$@"
fi

KUBE_VERSION="$(module_version "${KUBE_DIR}" k8s.io/kubernetes)"
KUBE_MINOR="${KUBE_VERSION#v1.}"
KUBE_MINOR="${KUBE_MINOR%%.*}"
# Without these, the binary reports v0.0.0-master in /version (and kubectl
# warns about skew); a release build sets them the same way.
KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitMajor=1"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitMinor=${KUBE_MINOR}"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitTreeState=clean"

build_tool kube-apiserver "${KUBE_DIR}" k8s.io/kubernetes \
  k8s.io/kubernetes/cmd/kube-apiserver \
  "first run only: several minutes on 2 cores" \
  -ldflags "${KUBE_LDFLAGS}"

# The namespace, garbage-collector and service-account controllers of every
# member cluster; same module, version and stamp scheme as kube-apiserver.
build_tool kube-controller-manager "${KUBE_DIR}" k8s.io/kubernetes \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  "first run only: a few minutes on 2 cores, sharing most of kube-apiserver's packages" \
  -ldflags "${KUBE_LDFLAGS}"

if [[ -n "${MAIN_BIN:-}" ]]; then
  # The rest of the bin dir is the one make test uses: the same etcd (its
  # storage API is what every supported kube-apiserver speaks) and mci.
  for f in "${MAIN_BIN}"/*; do
    name="$(basename "${f}")"
    if [[ -x "${f}" && ! -e "${OUTPUT_BIN}/${name}" ]]; then
      ln -s "${f}" "${OUTPUT_BIN}/${name}"
    fi
  done
  exit 0
fi

build_tool etcd "${REPO_ROOT}/hack/tools/etcd" go.etcd.io/etcd/server/v3 \
  go.etcd.io/etcd/server/v3 \
  "first run only: about a minute on 2 cores"
