#!/usr/bin/env bash
# The restore benchmark: one real training trajectory (scripts/gen_trajectory.py, fp32 GPT +
# Adam in DeepSpeed's layout, 8 versions at --size full) written version after version into a
# ckptfs mount with default options (lz4, deltas on), then per run: torch.load of every file of
# the newest version cold (drop_caches + fresh daemon) against the same files on native disk of
# the same filesystem, cold and warm `cp -r` of it, and the oldest version; daemon CPU-s per GB
# read and peak RSS. See scripts/bench/restore_bench.py for what each row is, README.md and
# docs/fs.md for results.
# Generating the trajectory takes ~3-8 minutes on 2 cores (--keep-data DIR once, then --data DIR
# skips it); measuring 3 runs ~2-4 minutes. Needs root (FUSE, drop_caches) and ~3 GB free.
#
# Usage: scripts/bench/restore.sh [--size ci|full] [--data DIR] [--keep-data DIR] [--runs N]
#                                 [--seed S] [--dir DIR] [--bin PATH] [--json FILE]
#   --size S        trajectory size to generate: full (10.8 M parameters, 8 versions of
#                   130 MB; the default) or ci (1 M parameters, 16 steps saved every 2: 8
#                   versions of 12.6 MB; quick, but small files make the timings noisy)
#   --data DIR      use trajectories already generated there (gen_trajectory.py --out DIR, with
#                   an fp32 trajectory) instead of generating; the directory is left as it is
#   --keep-data DIR generate into DIR and keep it (for a later --data DIR)
#   --runs N        runs, medians reported (default 3)
#   --seed S        gen_trajectory.py --seed (default 0)
#   --dir DIR       scratch directory (default: new one under /var/tmp); removed at the end
#   --bin PATH      measure this ckptfs binary (default build/ckptfs, built if missing)
#   --json FILE     also write every raw measurement there
set -euo pipefail
# One compound command: bash reads all of it before it runs, so editing this file during a run
# does not change the run.
{
cd "$(dirname "$0")/../.."

size=full
data=""
keep=""
runs=3
seed=0
dir=""
bin=build/ckptfs
json=()
usage() {
  echo "usage: $0 [--size ci|full] [--data DIR] [--keep-data DIR] [--runs N] [--seed S]" \
    "[--dir DIR] [--bin PATH] [--json FILE]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --keep-data) keep="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --json) json=(--json "$2"); shift 2 ;;
    *) usage ;;
  esac
done
case "$size" in ci|full) ;; *) usage ;; esac
if [ -n "$data" ] && [ -n "$keep" ]; then usage; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "restore.sh: run as root (FUSE mounts, drop_caches)" >&2
  exit 1
fi
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "restore.sh: needs python3-torch for /usr/bin/python3" >&2
  exit 1
fi

if [ "$bin" = build/ckptfs ] && [ ! -x build/ckptfs ]; then
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build build -j"$(nproc)" --target ckptfs >/dev/null
fi
[ -x "$bin" ] || { echo "restore.sh: no ckptfs binary at $bin" >&2; exit 1; }

if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/ckptfs-restorebench.XXXXXX)
else
  mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd)

# Mount points of fuse.ckptfs filesystems (the type follows the " - " in mountinfo).
ckptfs_mounts() {
  awk '{ for (i = 7; i <= NF; i++)
           if ($i == "-") { if ($(i + 1) == "fuse.ckptfs") print $5; break } }' /proc/self/mountinfo
}

cleanup() {
  local rc=$?
  local m
  for m in $(ckptfs_mounts); do
    case "$m" in
      "$dir"/*)
        "$dir/ckptfs" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" || true ;;
    esac
  done
  rm -rf "$dir"
  if ckptfs_mounts | grep -q "^$dir/"; then
    echo "restore.sh: a mount under $dir is still there" >&2
    rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
# The python steps run in the background with `wait`, so that a signal reaches this trap at
# once; it is passed on to the child, whose finally blocks unmount, and then cleanup runs.
child=""
on_signal() {
  if [ -n "$child" ]; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
run_child() {
  "$@" &
  child=$!
  local rc=0
  wait "$child" || rc=$?
  child=""
  [ "$rc" -eq 0 ] || exit "$rc"
}

# One binary for the whole run, even if build/ is rebuilt meanwhile.
cp "$bin" "$dir/ckptfs"
rev=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
if [ -n "$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  rev="$rev+changes"
fi
echo "restore.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r), $bin" \
  "built $(date -r "$bin" '+%F %T'), tree at $rev, dir $dir" >&2
start=$(date +%s)

if [ -z "$data" ]; then
  data="${keep:-$dir/data}"
  if [ -n "$keep" ] && [ -e "$keep" ]; then
    echo "restore.sh: --keep-data $keep exists; use --data $keep to reuse it" >&2
    exit 2
  fi
  steps=()
  if [ "$size" = ci ]; then steps=(--steps 16 --save-every 2); fi  # 8 versions, as full has
  run_child /usr/bin/python3 scripts/gen_trajectory.py --out "$data" --size "$size" \
    --seed "$seed" --trajectories fp32 "${steps[@]}" >&2
  echo "restore.sh: generated in $(( $(date +%s) - start )) s" >&2
fi
data=$(cd "$data" && pwd)

run_child /usr/bin/python3 scripts/bench/restore_bench.py --data "$data" --dir "$dir/work" \
  --bin "$dir/ckptfs" --runs "$runs" "${json[@]}"
echo "restore.sh: took $(( $(date +%s) - start )) s" >&2
exit
}
