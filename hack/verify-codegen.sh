#!/usr/bin/env bash
# Fails when generated code or CRDs are stale: regenerates into a scratch
# copy of the tree and diffs it against the working tree.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT

# Copy the tree without build output so the generators see the same inputs.
tar --exclude=./_output --exclude=./.git -cf - . | tar -xf - -C "${scratch}"
mkdir -p "${scratch}/_output"
ln -s "${OUTPUT_BIN}" "${scratch}/_output/bin"

"${scratch}/hack/update-codegen.sh" >/dev/null

status=0
for path in pkg/generated pkg/apis test/localclusterset/crds test/e2e/testdata/crds hack/api-rules-violations.list; do
  if ! diff -Nqr "${REPO_ROOT}/${path}" "${scratch}/${path}" >/dev/null; then
    echo "stale generated files in ${path}:" >&2
    diff -Nr "${REPO_ROOT}/${path}" "${scratch}/${path}" | head -40 >&2 || true
    status=1
  fi
done
if [[ ${status} -ne 0 ]]; then
  echo "run hack/update-codegen.sh and commit the result" >&2
fi
exit ${status}
