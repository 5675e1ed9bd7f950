#!/usr/bin/env bash
# Builds a release of mci into RELEASE_DIR (`make release VERSION=vX.Y.Z`):
#
#   <image>-<version>.tar       per binary, an OCI archive holding the image
#                               index <image>:<version> with an image for
#                               each of PLATFORMS (hack/build-images.sh)
#   <image>-<version>.cdx.json  per image, its CycloneDX bill of materials,
#                               written from the build information of the
#                               binaries it holds (hack/sbom)
#   mci-<X.Y.Z>.tgz             the Helm chart (helm package), version X.Y.Z
#                               and appVersion vX.Y.Z, the images' tag
#   release-notes.md            the section of CHANGELOG.md for the version
#   SHA256SUMS                  the SHA-256 of every other file
#
#   VERSION, GIT_COMMIT, GO_LDFLAGS   from the Makefile (hack/version.sh)
#   RELEASE_DIR                       an absent or empty directory
#   CHANGELOG                         CHANGELOG.md of the repository
#   PLATFORMS                         linux/amd64 linux/arm64
#
# Every binary is cross-compiled (CGO_ENABLED=0, -trimpath) for every
# platform: the images are FROM scratch, so no emulation is needed. Nothing
# is pushed anywhere; docs/development.md ("Releasing") says how to publish.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "${REPO_ROOT}"

: "${VERSION:?VERSION is required: make release VERSION=vX.Y.Z}"
: "${GIT_COMMIT:?GIT_COMMIT is required (hack/version.sh)}"
: "${GO_LDFLAGS:?GO_LDFLAGS is required (the Makefile)}"
: "${RELEASE_DIR:?RELEASE_DIR is required}"
CHANGELOG="${CHANGELOG:-${REPO_ROOT}/CHANGELOG.md}"
PLATFORMS="${PLATFORMS:-linux/amd64 linux/arm64}"
IMAGES="mci-apiserver mci-sidecar mci-epp"

fail() {
  echo "release: $*" >&2
  exit 1
}

# A release version is SemVer with a leading v, without build metadata
# (a + cannot be in an image tag): v1.2.3 or v1.2.3-rc.1.
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
if [[ ! "${VERSION}" =~ ${semver} ]]; then
  fail "VERSION=${VERSION} is not a release version: vMAJOR.MINOR.PATCH with an optional -prerelease (v1.2.3, v1.2.3-rc.1)"
fi
if [[ -e "${RELEASE_DIR}" && -n "$(ls -A "${RELEASE_DIR}")" ]]; then
  fail "${RELEASE_DIR} is not empty: a release is written into an empty directory"
fi

scratch="$(mktemp -d "${REPO_ROOT}/_output/release-build.XXXXXX")"
trap 'rm -rf "${scratch}"' EXIT
out="${scratch}/out"
mkdir -p "${out}"

# The release notes first: a version without its section in the changelog
# fails before anything is built. The section is what follows the heading
# "## vX.Y.Z ..." or "## [vX.Y.Z] ..." up to the next "## " heading, without
# its leading and trailing blank lines.
[[ -f "${CHANGELOG}" ]] || fail "no changelog at ${CHANGELOG}"
awk -v version="${VERSION}" '
  /^## / {
    if (found) exit
    heading = substr($0, 4)
    if (heading == version || index(heading, version " ") == 1 || index(heading, "[" version "]") == 1) found = 1
    next
  }
  found { lines[++n] = $0 }
  END {
    first = 1; last = n
    while (first <= last && lines[first] ~ /^[[:space:]]*$/) first++
    while (last >= first && lines[last] ~ /^[[:space:]]*$/) last--
    for (i = first; i <= last; i++) print lines[i]
  }
' "${CHANGELOG}" >"${out}/release-notes.md"
if [[ ! -s "${out}/release-notes.md" ]]; then
  fail "${CHANGELOG} has no section for ${VERSION}: add one under a heading \"## ${VERSION} - YYYY-MM-DD\" saying what the release changes"
fi

start=${SECONDS}
timestamp="$(git show -s --format=%ct HEAD 2>/dev/null || echo 0)"

bin="${scratch}/bin"
for platform in ${PLATFORMS}; do
  goos="${platform%%/*}" goarch="${platform#*/}"
  echo "+++ building the binaries for ${platform}" >&2
  CGO_ENABLED=0 GOOS="${goos}" GOARCH="${goarch}" \
    go build -trimpath -ldflags "${GO_LDFLAGS}" -o "${bin}/${goos}_${goarch}/" ./cmd/...
done

VERSION="${VERSION}" GIT_COMMIT="${GIT_COMMIT}" IMAGES="${IMAGES}" IMAGES_DIR="${out}" \
  PLATFORMS="${PLATFORMS}" BINARIES_DIR="${bin}" hack/build-images.sh

go build -o "${scratch}/sbom" ./hack/sbom
for image in ${IMAGES}; do
  binaries=()
  for platform in ${PLATFORMS}; do
    binaries+=("${bin}/${platform%%/*}_${platform#*/}/${image}")
  done
  "${scratch}/sbom" --name "${image}" --version "${VERSION}" --timestamp "${timestamp}" \
    --output "${out}/${image}-${VERSION}.cdx.json" "${binaries[@]}"
done

# Helm wants SemVer chart versions (no v); appVersion is the images' tag.
hack/build-helm.sh
"${OUTPUT_BIN}/helm" package charts/mci --version "${VERSION#v}" --app-version "${VERSION}" \
  --destination "${out}" >/dev/null

(cd "${out}" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs sha256sum -- >SHA256SUMS)

mkdir -p "${RELEASE_DIR}"
mv "${out}"/* "${RELEASE_DIR}/"
echo "+++ release ${VERSION} (${GIT_COMMIT}) in ${RELEASE_DIR} after $((SECONDS - start))s:" >&2
(cd "${RELEASE_DIR}" && ls -l) >&2
