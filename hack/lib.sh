#!/usr/bin/env bash
# Shared settings for hack/ scripts: where the repository is, where built
# tools go, and how to build a tool once and reuse it.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
OUTPUT_BIN="${REPO_ROOT}/_output/bin"
mkdir -p "${OUTPUT_BIN}"

CONTROLLER_TOOLS_VERSION="v0.23.0"

# ensure_controller_gen installs the pinned controller-gen into _output/bin.
ensure_controller_gen() {
  local stamp="${OUTPUT_BIN}/.controller-gen-${CONTROLLER_TOOLS_VERSION}"
  if [[ ! -x "${OUTPUT_BIN}/controller-gen" || ! -f "${stamp}" ]]; then
    echo "+++ building controller-gen ${CONTROLLER_TOOLS_VERSION}" >&2
    GOBIN="${OUTPUT_BIN}" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@${CONTROLLER_TOOLS_VERSION}"
    touch "${stamp}"
  fi
}
