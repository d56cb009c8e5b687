#!/usr/bin/env bash
# The filesystem benchmark: a real ~1 GiB torch training state (transformer + Adam, built once
# in memory on CPU) saved into a ckptfs mount and into a native directory on the same disk,
# read back with cp cold and warm, plus store stats, daemon peak RSS and the writeback-cache
# and readahead tuning checks. Prints one table of ratios measured in the same run; see
# scripts/bench/fs_bench.py for what each row is, README.md and docs/fs.md for results.
# About 5-8 minutes on 2 cores; needs root (FUSE, drop_caches, /sys/class/bdi) and ~12 GB free.
#
# Usage: scripts/bench/fs.sh [--runs N] [--dir DIR] [--no-tuning] [--spool-compare]
#                            [--json FILE] [--no-build]
#                            [--bin PATH]
#   --runs N     runs per measurement, medians reported (default 3)
#   --dir DIR    scratch directory on the disk to measure (default: new one under /var/tmp);
#                everything written there is removed at the end
#   --no-tuning  skip the writeback-cache, readahead and diagnostic rows (about half the time)
#   --spool-compare  only the default mount (no spool) and one with the write spool (CKPTFS_SPOOL=1),
#                no readahead/cache rows
#   --json FILE  also write every raw measurement there
#   --no-build   use build/ckptfs as it is (e.g. while someone else builds in build/)
#   --bin PATH   measure this ckptfs binary instead of build/ckptfs (implies --no-build)
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=3
dir=""
build=1
bin=build/ckptfs
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --no-tuning) extra+=(--no-tuning); shift ;;
    --spool-compare) extra+=(--spool-compare); shift ;;
    --json) extra+=(--json "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    --bin) bin="$2"; build=0; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--dir DIR] [--no-tuning] [--spool-compare] [--json FILE]" \
         "[--no-build]" \
         "[--bin PATH]" >&2
       exit 2 ;;
  esac
done

if [ "$bin" = build/ckptfs ] && { [ "$build" -eq 1 ] || [ ! -x build/ckptfs ]; }; then
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build build -j"$(nproc)" --target ckptfs >/dev/null
fi

if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/ckptfs-fsbench.XXXXXX)
else
  mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd)

cleanup() {
  local rc=$?
  # Unmount whatever is still mounted under $dir (the python side unmounts in its finally
  # blocks; this covers a kill), then remove every file the run wrote.
  for m in "$dir"/mnt_*; do
    [ -d "$m" ] || continue
    if mount | grep -q " on $m type fuse.ckptfs"; then
      "$dir/ckptfs" umount "$m" >/dev/null 2>&1 || build/ckptfs umount "$m" >/dev/null 2>&1 ||
        fusermount3 -u -z "$m" || true
    fi
  done
  rm -rf "$dir"
  if mount | grep -q "fuse.ckptfs" && mount | grep "fuse.ckptfs" | grep -q "$dir"; then
    echo "fs.sh: a mount under $dir is still there" >&2
    rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One binary for the whole run, even if build/ is rebuilt meanwhile.
cp "$bin" "$dir/ckptfs"
what="$bin built $(date -r "$bin" '+%F %T')"
if [ "$bin" = build/ckptfs ]; then
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
  if [ -n "$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    rev="$rev+changes"
  fi
  what="$what, tree at $rev"
fi
echo "fs.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r), dir $dir," \
  "$what" >&2
start=$(date +%s)
/usr/bin/python3 scripts/bench/fs_bench.py --dir "$dir" --bin "$dir/ckptfs" --runs "$runs" \
  "${extra[@]}"
echo "fs.sh: took $(( $(date +%s) - start )) s" >&2
