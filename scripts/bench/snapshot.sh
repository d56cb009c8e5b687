#!/bin/bash
# CPU benchmark of the snapshot engine (docs/snapshot.md): a ~1 GiB host state dict (a
# transformer + Adam moments, fp32) saved RUNS times each way, medians printed:
#   ckptfs.snapshot: time until staged() and until wait(); bytes stored
#   torch.save + fsync to a native directory; torch.save into the mount (+ fsync)
# Needs root (mount), the build (BUILD, default build/) and Debian's /usr/bin/python3 with torch.
#
#   scripts/bench/snapshot.sh [RUNS] [BUILD]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-3}
BUILD=${2:-build}
CKPTFS=$PWD/$BUILD/ckptfs CKPTFS_SNAPSHOT_LIB=$PWD/$BUILD/libckptfs_snapshot.so \
  PYTHONPATH=$PWD/python:$PWD/tests/fs /usr/bin/python3 scripts/bench/snapshot_bench.py "$RUNS"
