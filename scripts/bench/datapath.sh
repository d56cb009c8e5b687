#!/usr/bin/env bash
# The daemon's CPU seconds per GB written and read, page faults and peak RSS, for dd of fp32
# torch files through a mount (new bytes, then deltas; cold reads): see datapath.py. About
# 1-2 minutes per run on 2 cores; needs root and ~6 GB free. A narrower companion to fs.sh for
# measuring changes to the data path.
#
# Usage: scripts/bench/datapath.sh [--runs N] [--dir DIR] [--bin PATH] [--gib G]
#                                  [--cache-size 256M] [--inflight 256M]
#   --dir DIR   scratch directory (default: /var/tmp/ckptfs-datapath, kept between calls so the
#               generated torch files are reused; the store is removed after each run)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=/var/tmp/ckptfs-datapath
bin=build/ckptfs
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --runs|--gib|--cache-size|--inflight) args+=("$1" "$2"); shift 2 ;;
    *) echo "usage: $0 [--runs N] [--dir DIR] [--bin PATH] [--gib G] [--cache-size S]" \
         "[--inflight S]" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
# One binary for the whole run, even if build/ is rebuilt meanwhile.
cp "$bin" "$dir/ckptfs.bin"
cleanup() {
  if mount | grep -q " on $dir/mnt type fuse.ckptfs"; then
    "$dir/ckptfs.bin" umount "$dir/mnt" >/dev/null 2>&1 || fusermount3 -u -z "$dir/mnt" || true
  fi
  rm -rf "$dir/store" "$dir/ckptfs.bin"
}
trap cleanup EXIT
echo "datapath.sh: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $bin built" \
  "$(date -r "$bin" '+%F %T'), tree at $(git rev-parse --short HEAD)" >&2
/usr/bin/python3 scripts/bench/datapath.py --dir "$dir" --bin "$dir/ckptfs.bin" "${args[@]}"
