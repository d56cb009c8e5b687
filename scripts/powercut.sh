#!/usr/bin/env bash
# Power-loss simulation, long form (issue 15; docs/reliability.md): tests/fs/test_powercut.py
# with ROUNDS power cuts. The store lives on powercut_fs (tests/powercut/powercut_fs.cc), which
# drops unsynced writes at each cut; after every cut the store must open, every acknowledged
# file read back bitwise and `ckptfs verify` be clean. CTest runs the short form (fs_powercut).
#
# Usage: scripts/powercut.sh [ROUNDS] [SEED] [BUILD_DIR]   ROUNDS default 200, SEED default
#        from the clock (printed; rerun a failure with it), BUILD_DIR default build (it must
#        hold ckptfs and powercut_fs: cmake --build BUILD_DIR --target ckptfs powercut_fs).
# Needs root and /dev/fuse. Prints one summary line: POWERCUT SUMMARY {...}.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-200}"
seed="${2:-$(( $(date +%s) % 100000 ))}"
build="$(realpath "${3:-build}")"
for bin in ckptfs powercut_fs; do
  if [ ! -x "$build/$bin" ]; then
    echo "powercut.sh: no $build/$bin; build it: cmake --build $build --target ckptfs powercut_fs" >&2
    exit 2
  fi
done
CKPTFS="$build/ckptfs" POWERCUT_FS="$build/powercut_fs" \
  CKPTFS_POWERCUT_ROUNDS="$rounds" CKPTFS_POWERCUT_SEED="$seed" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 tests/fs/test_powercut.py
