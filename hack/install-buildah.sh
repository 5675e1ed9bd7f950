#!/usr/bin/env bash
# Installs buildah, which `make images` builds the container images with,
# from the distribution's packages when it is not on PATH already. It needs
# root (apt-get); images are built without a daemon and without pulling
# anything from an image registry.
set -o errexit -o nounset -o pipefail

if command -v buildah >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-buildah: buildah is missing and there is no apt-get here: install buildah with the system's package manager" >&2
  exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
  sudo=(sudo)
fi
echo "+++ installing buildah" >&2
"${sudo[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends buildah
