#!/usr/bin/env bash
# Builds the helm CLI that the chart test (make test-chart) runs, from the
# tools module hack/tools/helm, into _output/bin. Helm has a module of its
# own so that its k8s.io dependency versions never move those of mci's
# go.mod. As for the kube tools, a build happens once per pinned version
# (build_tool in lib.sh, with its stamp file); later runs only check it.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

# Two builds started together must not both build (or one read the other's
# half-written binary): serialise on a lock when flock is available.
if command -v flock >/dev/null 2>&1 && [[ -z "${MCI_HELM_LOCKED:-}" ]]; then
  exec env MCI_HELM_LOCKED=1 flock "${OUTPUT_BIN}/.helm.lock" "$0" "$@"
fi

HELM_DIR="${REPO_ROOT}/hack/tools/helm"
HELM_VERSION="$(module_version "${HELM_DIR}" helm.sh/helm/v4)"

# Without it, `helm version` reports the minor only (v4.3); a release build
# sets it the same way.
build_tool helm "${HELM_DIR}" helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm \
  "first run only: a few minutes on 2 cores" \
  -trimpath -ldflags "-X helm.sh/helm/v4/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
