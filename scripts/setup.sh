#!/usr/bin/env bash
# Installs ckptfs's Debian 12 build and test dependencies (idempotent) and builds Release into
# build/. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config git
  libfuse3-dev fuse3 liburing-dev liblz4-dev libzstd-dev liblmdb-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
  libssl-dev zlib1g-dev python3-torch python3-numpy zstd clang-14 libclang-rt-14-dev
  help2man dpkg-dev  # the man page and the .deb (packaging/)
  # The S3 backend (engine/objstore/) and its tests: a one-node Ceph cluster with radosgw.
  libcurl4-openssl-dev ceph-mon ceph-mgr ceph-osd radosgw ceph-common python3-boto3
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${1:-}" != "--no-build" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j"$(nproc)"
fi
