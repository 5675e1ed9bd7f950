#!/usr/bin/env bash
# Builds the container images of build/Containerfile with buildah into OCI
# archives: _output/images/<binary>-<version>.tar, each holding one image
# named <binary>:<version>. `make images` runs it after `make build`, whose
# static, version-stamped binaries in _output/bin the images copy.
#
#   VERSION, GIT_COMMIT (hack/version.sh)  the image tag and labels
#   IMAGE_SOURCE                           org.opencontainers.image.source
#   IMAGES                                 which binaries (all three)
#
# Runs without a daemon or an image registry: buildah with the vfs storage
# driver and chroot isolation (as root, no user namespaces needed), its
# storage in a scratch directory of this run under _output so that runs do
# not share state. File times and the creation time are the commit's, so
# the same commit (and CA bundle) builds images of the same digest.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

: "${VERSION:?VERSION is required (hack/version.sh)}"
: "${GIT_COMMIT:?GIT_COMMIT is required (hack/version.sh)}"
IMAGE_SOURCE="${IMAGE_SOURCE:-https://github.com/mci-dev/mci}"
IMAGES="${IMAGES:-mci-apiserver mci-sidecar mci-epp}"
IMAGES_DIR="${REPO_ROOT}/_output/images"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

"${REPO_ROOT}/hack/install-buildah.sh"

if [[ ! -s "${CA_BUNDLE}" ]]; then
  echo "build-images: no CA bundle at ${CA_BUNDLE} (install ca-certificates or set CA_BUNDLE)" >&2
  exit 1
fi
for image in ${IMAGES}; do
  if [[ ! -x "${OUTPUT_BIN}/${image}" ]]; then
    echo "build-images: ${OUTPUT_BIN}/${image} is missing: run make build" >&2
    exit 1
  fi
done

mkdir -p "${IMAGES_DIR}"
scratch="$(mktemp -d "${REPO_ROOT}/_output/images-build.XXXXXX")"
trap 'rm -rf "${scratch}"' EXIT
context="${scratch}/context"
mkdir -p "${context}"
cp "${CA_BUNDLE}" "${context}/ca-certificates.crt"
for image in ${IMAGES}; do
  cp "${OUTPUT_BIN}/${image}" "${context}/${image}"
done

export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
buildah=(buildah --root "${scratch}/storage" --runroot "${scratch}/run" --storage-driver vfs)
timestamp="$(git show -s --format=%ct HEAD 2>/dev/null || echo 0)"

for image in ${IMAGES}; do
  name="${image}:${VERSION}"
  archive="${IMAGES_DIR}/${image}-${VERSION}.tar"
  echo "+++ building ${name} into ${archive#"${REPO_ROOT}/"}" >&2
  "${buildah[@]}" build --quiet --isolation chroot --format oci \
    --file build/Containerfile --target "${image}" \
    --timestamp "${timestamp}" \
    --build-arg VERSION="${VERSION}" \
    --build-arg REVISION="${GIT_COMMIT}" \
    --build-arg SOURCE="${IMAGE_SOURCE}" \
    --tag "localhost/${name}" \
    "${context}" >/dev/null
  # An archive of another version of the image is a leftover of an older
  # build: only the current one is kept.
  rm -f "${IMAGES_DIR}/${image}"-v*.tar
  "${buildah[@]}" push --quiet "localhost/${name}" "oci-archive:${archive}:${name}"
done
