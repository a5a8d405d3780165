#!/usr/bin/env bash
# Build a minimal local container image (Debian minbase + python3 + pytest) for the
# container-backend tests, without pulling from any registry:
#   debootstrap --variant=minbase -> trim -> tar -> `podman import`.
# Usage: scripts/build_test_image.sh [IMAGE_NAME] [MIRROR]
# Needs root, debootstrap and podman (apt-get install debootstrap podman runc).
set -euo pipefail

IMAGE="${1:-localhost/thundersync-pytest:latest}"
MIRROR="${2:-http://deb.debian.org/debian}"
SUITE="${SUITE:-bookworm}"
ENGINE="${ENGINE:-podman}"

if "$ENGINE" image exists "$IMAGE" 2>/dev/null; then
  echo "image $IMAGE already present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install debootstrap" >&2; exit 2; }

WORK="$(mktemp -d /var/tmp/tsl-rootfs.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$WORK/rootfs"

debootstrap --variant=minbase --include=python3,python3-pytest,git,patch \
  "$SUITE" "$ROOTFS" "$MIRROR"

# Trim what a test run never needs.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/* \
  "$ROOTFS"/usr/share/info/*
mkdir -p "$ROOTFS/testbed"
chmod 1777 "$ROOTFS/testbed"

tar -C "$ROOTFS" -c . | "$ENGINE" import \
  --change 'WORKDIR /testbed' --change 'CMD ["/bin/bash"]' - "$IMAGE"
echo "built $IMAGE"
