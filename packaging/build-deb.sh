#!/usr/bin/env bash
# Builds the Debian package from an already built tree (nothing is compiled again when the tree
# is up to date). Usage: packaging/build-deb.sh [BUILD_DIR] [OUT_DIR]; prints the .deb's path.
# Needs dpkg-dev (dpkg-shlibdeps) and help2man (the man page), both in scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-$build/package}
[ -f "$build/CPackConfig.cmake" ] || { echo "build-deb: no $build/CPackConfig.cmake: configure and build first" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" >&2
mkdir -p "$out"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out" >&2
rm -rf "$out/_CPack_Packages"
ls -t "$out"/ckptfs_*.deb | head -1
