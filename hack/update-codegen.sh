#!/usr/bin/env bash
# Regenerates everything under pkg/generated, the zz_generated.* helpers in
# pkg/apis, the member-cluster CRDs that the local ClusterSet installs
# (test/localclusterset/crds: test fixtures, never install artifacts), and
# the hub's ClusterProfile CRD that the e2e tests install
# (test/e2e/testdata/crds). Generated code is never edited by hand; change
# the types and run this script.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

# `go mod download` fetches the pinned code-generator on a fresh machine
# (`go list -m -f '{{.Dir}}'` prints nothing until the module is downloaded)
# and names its directory.
CODEGEN_PKG="$(go mod download -json k8s.io/code-generator | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
if [[ -z "${CODEGEN_PKG}" || ! -f "${CODEGEN_PKG}/kube_codegen.sh" ]]; then
  echo "update-codegen: k8s.io/code-generator could not be downloaded (go mod download k8s.io/code-generator)" >&2
  exit 1
fi
# kube_codegen.sh installs its generators with `go install` into GOBIN.
export GOBIN="${OUTPUT_BIN}"
source "${CODEGEN_PKG}/kube_codegen.sh"

MODULE="github.com/mci-dev/mci"
BOILERPLATE="${REPO_ROOT}/hack/boilerplate.go.txt"

kube::codegen::gen_helpers \
  --boilerplate "${BOILERPLATE}" \
  "${REPO_ROOT}/pkg/apis"

kube::codegen::gen_openapi \
  --output-dir "${REPO_ROOT}/pkg/generated/openapi" \
  --output-pkg "${MODULE}/pkg/generated/openapi" \
  --extra-pkgs "k8s.io/api/core/v1" \
  --output-model-name-file zz_generated.model_name.go \
  --report-filename "${REPO_ROOT}/hack/api-rules-violations.list" \
  --update-report \
  --boilerplate "${BOILERPLATE}" \
  "${REPO_ROOT}/pkg/apis"

kube::codegen::gen_client \
  --with-watch \
  --output-dir "${REPO_ROOT}/pkg/generated" \
  --output-pkg "${MODULE}/pkg/generated" \
  --boilerplate "${BOILERPLATE}" \
  "${REPO_ROOT}/pkg/apis"

ensure_controller_gen
"${OUTPUT_BIN}/controller-gen" crd:crdVersions=v1 \
  paths=./pkg/apis/inferencepool/... \
  paths=./pkg/apis/inference/v1alpha2/... \
  paths=./pkg/apis/llmd/v1alpha2/... \
  output:crd:artifacts:config=test/localclusterset/crds

# ClusterProfile is the hub's API, installed by whoever runs the fleet, not
# by mci: its CRD is test data for the e2e tests, not an artifact.
"${OUTPUT_BIN}/controller-gen" crd:crdVersions=v1 \
  paths=./pkg/apis/clusterinventory/... \
  output:crd:artifacts:config=test/e2e/testdata/crds
