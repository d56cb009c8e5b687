#!/usr/bin/env bash
# ckptfs on an S3 store (issue 18): aggregate save and restore throughput of 1, 2 and 4 nodes
# (mounts of one s3:// store) beside the same cluster's raw PUT/GET of the same bytes, measured
# in the same run against a one-node Ceph that the bench starts and stops (tests/s3/
# ceph_fixture.py). Medians of --runs. See scripts/bench/s3_bench.py for what each row is.
# Needs root (FUSE), Ceph, python3-boto3 and torch (scripts/setup.sh). A few minutes on 2 cores.
#
# Usage: scripts/bench/s3.sh [--mib N] [--runs N] [--nodes 1,2,4] [--json FILE] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mib|--runs|--nodes|--json) args+=("$1" "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "usage: $0 [--mib N] [--runs N] [--nodes 1,2,4] [--json FILE] [--no-build]" >&2
       exit 2 ;;
  esac
done
if [ "$build" -eq 1 ] || [ ! -x build/ckptfs ]; then
  [ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target ckptfs >/dev/null
fi
exec /usr/bin/python3 scripts/bench/s3_bench.py --ckptfs build/ckptfs "${args[@]}"
