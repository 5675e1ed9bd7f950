#!/usr/bin/env bash
# Prints what the Makefile stamps into every binary and image (pkg/version),
# as three words: the version, the commit, the tree state.
#   version     `git describe` of the tree: the last v* tag, the commits
#               since and the abbreviated commit (v0.3.0-4-g1a2b3c4d5e6f);
#               v0.0.0-<commits>-g<commit> before the first tag; with a
#               -dirty suffix when tracked files have uncommitted changes
#   commit      the full hash of HEAD
#   tree state  clean or dirty
# Outside a git checkout: v0.0.0-dev unknown unknown (pkg/version.DevVersion).
set -o errexit -o nounset -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! commit="$(git rev-parse HEAD 2>/dev/null)"; then
  echo "v0.0.0-dev unknown unknown"
  exit 0
fi
state=clean
suffix=
if ! git diff --quiet HEAD -- 2>/dev/null; then
  state=dirty
  suffix=-dirty
fi
if ! version="$(git describe --tags --match 'v[0-9]*' --abbrev=12 HEAD 2>/dev/null)"; then
  version="v0.0.0-$(git rev-list --count HEAD)-g$(git rev-parse --short=12 HEAD)"
fi
echo "${version}${suffix} ${commit} ${state}"
