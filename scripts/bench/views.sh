#!/usr/bin/env bash
# The lazy-load benchmark (docs/views.md): a ~1 GiB torch state dict (GPT-like, 24 layers at
# d=896, 387 fp32 tensors, random normal data) torch.save'd into a ckptfs mount and copied to
# native disk; then, cold (fresh daemon + drop_caches) and each in a fresh /usr/bin/python3,
# the time to first tensor, the pack bytes read and the peak RSS of ckptfs.lazy_load + one
# mid-sized tensor vs torch.load of the whole file from the mount and from native disk (the
# peer, measured in the same run). Targets: lazy reads <= 3% of the stored bytes, first tensor
# <= 50 ms. Prints one table of medians; see scripts/bench/views_bench.py for each row.
# About 3-4 minutes on 2 cores with the default 5 runs; needs root (FUSE, drop_caches) and
# ~3 GB free.
#
# Usage: scripts/bench/views.sh [--runs N] [--dir DIR] [--bin PATH] [--tensor NAME]
#                               [--cache-size SIZE] [--no-steps] [--json FILE]
#   --runs N          cold runs per variant, medians reported (default 5)
#   --dir DIR         scratch directory (default: new one under $TMPDIR or /var/tmp); everything
#                     written there is removed at the end
#   --bin PATH        measure this ckptfs binary (default build/ckptfs, built if missing)
#   --tensor NAME     the tensor accessed (default layers.12.attn.q.weight, 3.06 MiB)
#   --cache-size SIZE ckptfs mount --cache-size (default: the mount's own)
#   --no-steps        skip the diagnostic step-by-step breakdown of the lazy path
#   --json FILE       also write every raw measurement there
set -euo pipefail
# One compound command: bash reads all of it before it runs, so editing this file during a run
# does not change what the run does.
{
cd "$(dirname "$0")/../.."

runs=5
dir=""
bin=build/ckptfs
extra=()
usage() {
  echo "usage: $0 [--runs N] [--dir DIR] [--bin PATH] [--tensor NAME] [--cache-size SIZE]" \
    "[--no-steps] [--json FILE]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --tensor) extra+=(--tensor "$2"); shift 2 ;;
    --cache-size) extra+=(--cache-size "$2"); shift 2 ;;
    --no-steps) extra+=(--no-steps); shift ;;
    --json) extra+=(--json "$2"); shift 2 ;;
    *) usage ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "views.sh: run as root (it mounts FUSE filesystems and drops the page cache)" >&2
  exit 1
fi
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "views.sh: Debian's /usr/bin/python3 needs torch and numpy" \
    "(apt-get install -y python3-torch python3-numpy)" >&2
  exit 1
fi
if [ "$bin" = build/ckptfs ] && [ ! -x build/ckptfs ]; then
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build build -j"$(nproc)" --target ckptfs >/dev/null
fi
[ -x "$bin" ] || { echo "views.sh: no ckptfs binary at $bin" >&2; exit 1; }

if [ -z "$dir" ]; then
  dir=$(mktemp -d "${TMPDIR:-/var/tmp}/ckptfs-viewsbench.XXXXXX")
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
  # Unmount whatever is still mounted under $dir (the python side unmounts in its finally
  # block; this covers a kill), then remove everything the run wrote there.
  local m
  for m in $(ckptfs_mounts); do
    case "$m" in
      "$dir"/*)
        "$dir/ckptfs" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" || true ;;
    esac
  done
  rm -rf "$dir"
  if ckptfs_mounts | grep -q "^$dir/"; then
    echo "views.sh: a mount under $dir is still there" >&2
    rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
# The python step runs in the background with `wait`, so that a signal reaches this trap at
# once (bash defers traps until a foreground child exits); it is passed on to the child, whose
# finally block unmounts, and then cleanup runs.
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

# One binary for the whole run, even if build/ is rebuilt meanwhile.
cp "$bin" "$dir/ckptfs"
rev=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
if [ -n "$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  rev="$rev+changes"
fi
echo "views.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r), $bin built" \
  "$(date -r "$bin" '+%F %T'), tree at $rev, dir $dir" >&2
start=$(date +%s)
/usr/bin/python3 scripts/bench/views_bench.py --dir "$dir" --bin "$dir/ckptfs" --runs "$runs" \
  "${extra[@]}" &
child=$!
rc=0
wait "$child" || rc=$?
child=""
[ "$rc" -eq 0 ] || exit "$rc"
echo "views.sh: took $(( $(date +%s) - start )) s" >&2
exit
}
