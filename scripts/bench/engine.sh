#!/usr/bin/env bash
# The engine benchmark on real fp32 torch checkpoints; see docs/engine.md for what it measures
# and for results. Builds build/engine_bench if needed, saves a small transformer and its Adam
# state twice with torch (v1, and v2 = one more step with half the layers frozen; ~350 MB each),
# runs the bench on them and removes what it wrote. About 2-3 minutes on 2 cores.
#
# Usage: scripts/bench/engine.sh [--runs N] [--only micro,e2e,hash,chunk] [--dir DIR] [--keep]
#   --runs N   runs per measurement, medians reported (default 5)
#   --dir DIR  scratch directory on the disk to measure (default: a new one under /var/tmp);
#              checkpoints already in DIR (v1.pt, v2.pt) are reused
#   --keep     keep DIR and the checkpoints afterwards
# Runs as root to drop the page cache before cold reads (else it falls back to fadvise).
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=5
only=micro,e2e,hash,chunk
dir=""
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--runs N] [--only micro,e2e,hash,chunk] [--dir DIR] [--keep]" >&2; exit 2 ;;
  esac
done

if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build build -j"$(nproc)" --target engine_bench >/dev/null

if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/ckptfs-bench.XXXXXX)
else
  mkdir -p "$dir"
fi
cleanup() {
  if [ "$keep" -eq 1 ]; then
    rm -rf "$dir/scratch"
    echo "engine.sh: kept $dir" >&2
  else
    rm -rf "$dir"
  fi
}
trap cleanup EXIT

if [ ! -f "$dir/v1.pt" ] || [ ! -f "$dir/v2.pt" ]; then
  echo "engine.sh: saving two torch checkpoints into $dir" >&2
  /usr/bin/python3 scripts/bench/gen_checkpoints.py "$dir" --hidden 512 --layers 8 >&2
fi
echo "engine.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r)" >&2
build/engine_bench --v1 "$dir/v1.pt" --v2 "$dir/v2.pt" --dir "$dir/scratch" --runs "$runs" \
  --only "$only"
