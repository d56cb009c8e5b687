#!/usr/bin/env bash
# The fault suite's long forms (issue 15; docs/reliability.md records their figures):
#   powercut  tests/fs/test_powercut.py: the store on powercut_fs (tests/powercut/), which drops
#             unsynced writes and directory entries at each simulated power cut
#   kill9     tests/fs/test_kill9.py: kill -9 of the daemon in every phase (save, fsync, sync,
#             seal, rm -rf, gc, forget, the background re-encoding, snapshot adoption)
#   flips     tests/fs/test_flips.py: ROUNDS single-byte flips spread over the packs and as
#             many over the catalog
#   random_ops  tests/fs/test_random_ops.py: ROUNDS random POSIX operations by 4 processes at
#             once, each compared with the same operation on a reference directory
# After every fault the store must open, every acknowledged file read back bitwise and
# `ckptfs verify` be clean (flips: found and named, or harmless; never other bytes). CTest runs
# short forms (fs_powercut, fs_kill9, fs_flips, fs_random_ops).
#
# Usage: scripts/faults.sh powercut|kill9|flips|random_ops [ROUNDS] [SEED] [BUILD_DIR]
#        ROUNDS default 200; SEED default from the clock (printed; rerun a failure with it);
#        BUILD_DIR default build (it must hold ckptfs, powercut_fs, libckptfs_snapshot.so:
#        cmake --build BUILD_DIR). Needs root and /dev/fuse; torch for the snapshot phase.
# Prints one summary line: POWERCUT SUMMARY, KILL9 SUMMARY, FLIPS SUMMARY or RANDOM_OPS
# SUMMARY {...}.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-}"
case "$kind" in
  powercut) var=CKPTFS_POWERCUT ;;
  kill9) var=CKPTFS_KILL9 ;;
  flips) var=CKPTFS_FLIPS ;;
  random_ops) var=CKPTFS_RANDOM_OPS ;;
  *) echo "usage: scripts/faults.sh powercut|kill9|flips|random_ops [ROUNDS] [SEED] [BUILD_DIR]" >&2
     exit 2 ;;
esac
rounds="${2:-200}"
seed="${3:-$(( $(date +%s) % 100000 ))}"
build="$(realpath "${4:-build}")"
for bin in ckptfs powercut_fs libckptfs_snapshot.so; do
  if [ ! -e "$build/$bin" ]; then
    echo "faults.sh: no $build/$bin; build it: cmake --build $build" >&2
    exit 2
  fi
done
env CKPTFS="$build/ckptfs" POWERCUT_FS="$build/powercut_fs" \
  CKPTFS_SNAPSHOT_LIB="$build/libckptfs_snapshot.so" \
  "${var}_ROUNDS=$rounds" "${var}_SEED=$seed" PYTHONDONTWRITEBYTECODE=1 \
  CKPTFS_FLIPS_PACK="$rounds" CKPTFS_FLIPS_CATALOG="$rounds" \
  /usr/bin/python3 "tests/fs/test_$kind.py"
