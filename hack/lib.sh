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

# module_version prints the version of module $2 that the tools module in
# directory $1 pins.
module_version() {
  go list -C "$1" -m -f '{{.Version}}' "$2"
}

# build_tool NAME TOOLS_DIR MODULE PACKAGE FIRST_RUN_NOTE [go build args...]
build_tool() {
  local name="$1" dir="$2" module="$3" pkg="$4" note="$5"
  shift 5
  local version
  version="$(module_version "${dir}" "${module}")"
  local bin="${OUTPUT_BIN}/${name}"
  local stamp="${OUTPUT_BIN}/.${name}-${version}"
  if [[ -x "${bin}" && -f "${stamp}" ]]; then
    echo "+++ ${name} ${version} already built: ${bin}" >&2
    return
  fi
  echo "+++ building ${name} ${version} (${note})..." >&2
  local start=${SECONDS}
  rm -f "${OUTPUT_BIN}/.${name}-"*
  # Build next to the target and rename, so a reader never sees half a binary.
  go build -C "${dir}" -o "${bin}.tmp" "$@" "${pkg}"
  mv -f "${bin}.tmp" "${bin}"
  echo "${module} ${version}" >"${stamp}"
  echo "+++ built ${name} ${version} in $((SECONDS - start))s: ${bin}" >&2
}
