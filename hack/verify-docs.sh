#!/usr/bin/env bash
# Fails when the generated pages of docs/reference are stale: regenerates
# them into a scratch directory and diffs them against the working tree.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT

"${REPO_ROOT}/hack/update-docs.sh" "${scratch}"

if ! diff -Nr "${REPO_ROOT}/docs/reference" "${scratch}/docs/reference" >"${scratch}/diff"; then
  echo "stale generated docs in docs/reference:" >&2
  head -40 "${scratch}/diff" >&2
  echo "run hack/update-docs.sh and commit the result" >&2
  exit 1
fi
