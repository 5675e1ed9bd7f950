#!/usr/bin/env bash
# Builds the container images of build/Containerfile with buildah into OCI
# archives: <images dir>/<binary>-<version>.tar, each holding one image (or
# image index) named <binary>:<version>. `make images` runs it after
# `make build`, whose static, version-stamped binaries in _output/bin the
# images copy; `make release` (hack/release.sh) runs it with PLATFORMS.
#
#   VERSION, GIT_COMMIT (hack/version.sh)  the image tag and labels
#   IMAGE_SOURCE                           org.opencontainers.image.source
#   IMAGES                                 which binaries (all three)
#   IMAGES_DIR                             where the archives go (_output/images)
#   PLATFORMS                              unset: one image of the build
#                                          machine's platform, from _output/bin;
#                                          "linux/amd64 linux/arm64": one OCI
#                                          image index per binary holding an
#                                          image per platform, each from
#                                          BINARIES_DIR/<os>_<arch>/<binary>
#
# Runs without a daemon or an image registry: buildah with the vfs storage
# driver and chroot isolation (as root, no user namespaces needed), its
# storage in a scratch directory of this run under _output so that runs do
# not share state. The images are FROM scratch and only COPY files, so an
# image of another architecture needs no emulation: buildah writes the
# platform into its configuration and the cross-compiled binary is copied
# as it is. File times and the creation time are the commit's, so the same
# commit (and CA bundle) builds images of the same digest.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

: "${VERSION:?VERSION is required (hack/version.sh)}"
: "${GIT_COMMIT:?GIT_COMMIT is required (hack/version.sh)}"
IMAGE_SOURCE="${IMAGE_SOURCE:-https://github.com/mci-dev/mci}"
IMAGES="${IMAGES:-mci-apiserver mci-sidecar mci-epp}"
IMAGES_DIR="${IMAGES_DIR:-${REPO_ROOT}/_output/images}"
PLATFORMS="${PLATFORMS:-}"
BINARIES_DIR="${BINARIES_DIR:-}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

"${REPO_ROOT}/hack/install-buildah.sh"

if [[ ! -s "${CA_BUNDLE}" ]]; then
  echo "build-images: no CA bundle at ${CA_BUNDLE} (install ca-certificates or set CA_BUNDLE)" >&2
  exit 1
fi
# Without PLATFORMS, one image of the build machine's platform ("native",
# buildah's default) from _output/bin; with it, one image per platform.
if [[ -n "${PLATFORMS}" && -z "${BINARIES_DIR}" ]]; then
  echo "build-images: PLATFORMS needs BINARIES_DIR, which holds <os>_<arch>/<binary> for each platform" >&2
  exit 1
fi
platforms=(${PLATFORMS:-native})
binaries_dir() {
  if [[ "$1" == native ]]; then
    echo "${OUTPUT_BIN}"
  else
    echo "${BINARIES_DIR}/${1%%/*}_${1#*/}"
  fi
}
for platform in "${platforms[@]}"; do
  for image in ${IMAGES}; do
    if [[ ! -x "$(binaries_dir "${platform}")/${image}" ]]; then
      echo "build-images: $(binaries_dir "${platform}")/${image} is missing: run make build (or make release)" >&2
      exit 1
    fi
  done
done

mkdir -p "${IMAGES_DIR}"
scratch="$(mktemp -d "${REPO_ROOT}/_output/images-build.XXXXXX")"
trap 'rm -rf "${scratch}"' EXIT
# One build context per platform: the CA bundle and that platform's binaries.
for platform in "${platforms[@]}"; do
  context="${scratch}/context/${platform//\//_}"
  mkdir -p "${context}"
  cp "${CA_BUNDLE}" "${context}/ca-certificates.crt"
  for image in ${IMAGES}; do
    cp "$(binaries_dir "${platform}")/${image}" "${context}/${image}"
  done
done

export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
buildah=(buildah --root "${scratch}/storage" --runroot "${scratch}/run" --storage-driver vfs)
timestamp="$(git show -s --format=%ct HEAD 2>/dev/null || echo 0)"

# build_image IMAGE PLATFORM BUILDAH_BUILD_ARGS...
build_image() {
  local image="$1" platform="$2"
  shift 2
  local platform_args=()
  if [[ "${platform}" != native ]]; then
    platform_args=(--platform "${platform}")
  fi
  "${buildah[@]}" build --quiet --isolation chroot --format oci \
    "${platform_args[@]}" \
    --file build/Containerfile --target "${image}" \
    --timestamp "${timestamp}" \
    --build-arg VERSION="${VERSION}" \
    --build-arg REVISION="${GIT_COMMIT}" \
    --build-arg SOURCE="${IMAGE_SOURCE}" \
    "$@" \
    "${scratch}/context/${platform//\//_}" >/dev/null
}

for image in ${IMAGES}; do
  name="${image}:${VERSION}"
  archive="${IMAGES_DIR}/${image}-${VERSION}.tar"
  echo "+++ building ${name} (${platforms[*]}) into ${archive#"${REPO_ROOT}/"}" >&2
  # An archive of another version of the image is a leftover of an older
  # build: only the current one is kept.
  rm -f "${IMAGES_DIR}/${image}"-v*.tar
  if [[ -z "${PLATFORMS}" ]]; then
    build_image "${image}" native --tag "localhost/${name}"
    "${buildah[@]}" push --quiet "localhost/${name}" "oci-archive:${archive}:${name}"
    continue
  fi
  # One image index (manifest list) holding the image of every platform;
  # pushed with --all, the archive holds the index and all its images.
  "${buildah[@]}" manifest create "localhost/${name}" >/dev/null
  for platform in "${platforms[@]}"; do
    build_image "${image}" "${platform}" --manifest "localhost/${name}"
  done
  "${buildah[@]}" manifest push --quiet --all --format oci "localhost/${name}" "oci-archive:${archive}:${name}"
done
