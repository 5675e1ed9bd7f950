#!/usr/bin/env bash
# Regenerates the generated pages of docs/reference: flags.md from the flag
# sets of cmd/*/app and api.md from the OpenAPI definitions of pkg/apis
# (run hack/update-codegen.sh first when the types changed). Never edit
# those pages by hand; change the flags or the types and run this script.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

go run ./hack/gen-docs --root "${1:-${REPO_ROOT}}"
