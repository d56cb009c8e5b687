#!/usr/bin/env bash
# Fuzzes the parsers of untrusted checkpoint bytes with libFuzzer: builds tests/fuzz/*_fuzz with
# clang-14 (ASan, UBSan) in build-fuzz/, seeds each target's corpus with real files (written by
# python at first use: torch.save checkpoints and zipfile archives, their data.pkl, safetensors
# files), and runs.
#
# Usage: scripts/fuzz.sh [TARGET] [SECONDS] [JOBS]   one target (default torch_zip), SECONDS
#                                                    (default 30) with JOBS processes (default 1)
#        scripts/fuzz.sh all [SECONDS] [JOBS]        every target in turn
#        scripts/fuzz.sh --ci [SECONDS]              every target for SECONDS (default 20) from
#                                                    its seeds only; fails on the first crash
#        scripts/fuzz.sh --runs N TARGET|all [SECONDS]
#                                                    the long runs of docs/reliability.md: each
#                                                    target until N executions (or SECONDS, when
#                                                    given), one process; log in
#                                                    build-fuzz/TARGET-runs.log
#        scripts/fuzz.sh SECONDS [JOBS]              the torch_zip target (as before targets)
#        scripts/fuzz.sh --fast ...                  any of the above with targets built with
#                                                    UBSan alone, no ASan (build-fuzz-fast/;
#                                                    several times the executions a second),
#                                                    growing the same corpus: for the long runs
#        scripts/fuzz.sh --replay TARGET|all         every input of the target's corpus once
#                                                    under ASan + UBSan (after --fast runs: what
#                                                    they found, checked for memory errors)
# Targets: torch_zip (engine/format/torch_zip.h), torch_pickle (torch_pickle.h), safetensors
# (safetensors.h), views (engine/views/tensor_view.h, precision_view.h: whole files; its
# dictionary is the other three's), control_protocol (engine/namespace/control_protocol.h: the
# frames and requests of the control socket), piece_codec (engine/codec/piece_codec.h, huffman.h:
# the record decoder, and encode/decode round trips; seeded with records the current encoder
# writes). The corpus grows in build-fuzz/corpus/TARGET/; a
# crashing input is saved as build-fuzz/crash-* (rerun it with build-fuzz/TARGET_fuzz FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(torch_zip torch_pickle safetensors views control_protocol piece_codec)
ci=0
runs=0
replay=0
sanitizers="address,undefined"
build=build-fuzz
if [ "${1:-}" = --fast ]; then
  sanitizers=undefined
  build=build-fuzz-fast
  shift
fi
if [ "${1:-}" = --replay ]; then
  replay=1
  shift
  [ "${1:-}" ] || { echo "fuzz.sh: --replay needs a target or all" >&2; exit 2; }
fi
if [ "${1:-}" = --runs ]; then
  runs="${2:?fuzz.sh: --runs N TARGET}"
  shift 2
  [ "${1:-}" ] || { echo "fuzz.sh: --runs N needs a target or all" >&2; exit 2; }
fi
case "${1:-}" in
  --ci) ci=1; shift; selected=("${targets[@]}"); seconds="${1:-20}"; jobs=1 ;;
  all) shift; selected=("${targets[@]}") ;;
  torch_zip|torch_pickle|safetensors|views|control_protocol|piece_codec) selected=("$1"); shift ;;
  ''|[0-9]*) selected=(torch_zip) ;;
  *) echo "fuzz.sh: unknown target '$1' (${targets[*]}, all, --ci)" >&2; exit 2 ;;
esac
runs_seconds=0  # --runs: no time limit unless SECONDS is given
if [ "$ci" -eq 0 ]; then
  runs_seconds="${1:-0}"
  seconds="${1:-30}"
  jobs="${2:-1}"
fi
corpora=build-fuzz/corpus  # one corpus per target, whichever build grows it

# Configured every time (seconds when the cache exists): a build dir configured before a
# target was added knows no rule for it, and `cmake --build --target` fails before it would
# regenerate.
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCKPTFS_FUZZ_SANITIZERS="$sanitizers" >/dev/null
fuzzers=()
for t in "${selected[@]}"; do fuzzers+=("${t}_fuzz"); done
cmake --build "$build" --target "${fuzzers[@]}" -j"$(nproc)" >/dev/null

# Writes the seeds of target $1 into directory $2.
seed() {
  local target="$1" dir="$2"
  mkdir -p "$dir"
  case "$target" in
    torch_zip)
      /usr/bin/python3 scripts/gen_torch_sample.py "$dir/mlp.pt" --hidden 4
      /usr/bin/python3 - "$dir/state_dict.pt" <<'PY'
import sys
import torch
torch.manual_seed(0)
torch.save({"w": torch.randn(8, 8), "b": torch.zeros(0), "step": torch.tensor(3)}, sys.argv[1])
PY
      /usr/bin/python3 engine/format/torch_zip_testdata.py zips "$dir" 1000
      ;;
    torch_pickle)
      local tmp="$build/seeds_torch_pickle"
      rm -rf "$tmp"
      /usr/bin/python3 engine/format/torch_pickle_testdata.py write "$tmp" >/dev/null
      /usr/bin/python3 engine/format/torch_pickle_testdata.py evil "$tmp"
      cp "$tmp"/*.pkl "$dir"/
      rm -rf "$tmp"
      ;;
    safetensors)
      local tmp="$build/seeds_safetensors"
      rm -rf "$tmp"
      /usr/bin/python3 engine/format/safetensors_testdata.py write "$tmp" >/dev/null
      cp "$tmp"/*.safetensors "$dir"/
      rm -rf "$tmp"
      ;;
    views)
      # Whole checkpoints: torch.save files with every floating dtype, strided and offset views
      # into shared storages, and safetensors files.
      local tmp="$build/seeds_views"
      rm -rf "$tmp"
      /usr/bin/python3 scripts/gen_torch_sample.py "$dir/mlp.pt" --hidden 4
      /usr/bin/python3 - "$dir" <<'PY'
import sys
import torch
torch.manual_seed(0)
out = sys.argv[1]
base = torch.randn(6, 8)
torch.save({
    "f32": torch.randn(4, 4),
    "f64": torch.randn(3, dtype=torch.float64),
    "f16": torch.randn(2, 3).half(),
    "bf16": torch.randn(5).bfloat16(),
    "i64": torch.arange(4),
    "u8": torch.tensor([1, 2, 3], dtype=torch.uint8),
    "bool": torch.tensor([True, False]),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 2),
}, f"{out}/dtypes.pt")
torch.save({
    "base": base,
    "transposed": base.t(),
    "row": base[2],
    "column": base[:, 3],
    "strided": base[::2, 1::3],
    "expanded": torch.randn(1, 3).expand(4, 3),
}, f"{out}/views.pt")
torch.save({"w": torch.randn(8, 8).bfloat16(), "b": torch.randn(8).half(), "step": 7},
           f"{out}/half.pt")
PY
      /usr/bin/python3 engine/format/safetensors_testdata.py write "$tmp" >/dev/null
      cp "$tmp"/*.safetensors "$dir"/
      rm -rf "$tmp"
      ;;
    control_protocol)
      # Requests as the snapshot engine and the ckptfs command send them: each alone (the JSON)
      # and a whole connection's worth (framed).
      python3 - "$dir" <<'PY'
import json, struct, sys
out = sys.argv[1]
cid = "ab" * 32
reqs = {
    "begin": {"op": "begin", "version": "global_step100", "rank": 1, "world_size": 4},
    "reserve": {"op": "reserve_pack"},
    "commit": {"op": "commit", "file": "rank_1.safetensors", "size": 4096, "pack_id": 7,
               "pack_length": 4200, "chunks": [[cid, 4096, 32, 4168], [cid, 4096]],
               "shard": {"rank": 1, "file": "rank_1.safetensors",
                         "tensors": {"w": {"dtype": "F32", "shape": [32, 32],
                                           "global_shape": [128, 32], "offsets": [32, 0]}}}},
    "admin": {"op": "admin", "cmd": "log"},
    "admin_diff": {"op": "admin", "cmd": "diff", "a": "v1", "b": "v2"},
}
def frame(r):
    body = json.dumps(r, separators=(",", ":")).encode()
    return struct.pack("<I", len(body)) + body
for name, r in reqs.items():
    open(f"{out}/{name}.json", "wb").write(json.dumps(r).encode())
open(f"{out}/session.bin", "wb").write(
    b"".join(frame(reqs[n]) for n in ("begin", "reserve", "commit")))
open(f"{out}/admin.bin", "wb").write(frame(reqs["admin"]) + frame(reqs["admin_diff"]))
PY
      ;;
    piece_codec)
      # Records as the current encoder writes them (fp32, fp16 and plain bytes with each codec,
      # rotated planes, xor, sub and scaled sub deltas), each behind the header that decodes it.
      CKPTFS_PIECE_SEEDS="$dir" "$build/piece_codec_fuzz" 2>/dev/null
      ;;
  esac
}

# The dictionary of target $1.
dict() {
  if [ "$1" = views ]; then
    cat tests/fuzz/torch_zip.dict tests/fuzz/torch_pickle.dict tests/fuzz/safetensors.dict \
      >"$build/views.dict"
    echo "$build/views.dict"
  else
    echo "tests/fuzz/$1.dict"
  fi
}

max_len() {
  case "$1" in
    torch_zip) echo 32768 ;;
    views) echo 65536 ;;
    piece_codec) echo 81920 ;;  # a round trip of 16K fp32 elements, which the codec may split
    *) echo 16384 ;;
  esac
}

for t in "${selected[@]}"; do
  seeds="$build/seeds/$t"
  # piece_codec's seeds are what its binary's encoder writes: written again when it is rebuilt.
  if [ "$t" = piece_codec ] && [ -d "$seeds" ] && [ "$build/${t}_fuzz" -nt "$seeds" ]; then
    rm -rf "$seeds"
  fi
  if [ ! -d "$seeds" ]; then
    rm -rf "$seeds.tmp"
    seed "$t" "$seeds.tmp"
    mv "$seeds.tmp" "$seeds"
  fi
  args=(-max_total_time="$seconds" -max_len="$(max_len "$t")" -dict="$(dict "$t")"
        -timeout=10 -artifact_prefix="$build/" -print_final_stats=1)
  if [ "$ci" -eq 1 ]; then
    # A fresh corpus each time, so that a CI run depends only on the seeds.
    corpus="$build/ci-corpus/$t"
    rm -rf "$corpus"
    mkdir -p "$corpus"
    echo "fuzz.sh: $t for $seconds s"
    if ! "$build/${t}_fuzz" "${args[@]}" "$corpus" "$seeds" >"$build/$t-ci.log" 2>&1; then
      tail -n 40 "$build/$t-ci.log" >&2
      echo "fuzz.sh: $t failed; the input is $build/crash-* (log: $build/$t-ci.log)" >&2
      exit 1
    fi
    grep -E '^stat::number_of_executed_units|^Done' "$build/$t-ci.log" || true
    continue
  fi
  corpus="$corpora/$t"
  mkdir -p "$corpus"
  if [ "$replay" -eq 1 ]; then
    echo "fuzz.sh: $t: replaying $(find "$corpus" -type f | wc -l) inputs under $sanitizers"
    if ! "$build/${t}_fuzz" -runs=0 -timeout=60 -rss_limit_mb=4096 \
        -artifact_prefix="$build/" "$corpus" >"$build/$t-replay.log" 2>&1; then
      tail -n 40 "$build/$t-replay.log" >&2
      echo "fuzz.sh: $t failed on its corpus; the input is $build/crash-*" >&2
      exit 1
    fi
    grep -E '^Done|INITED' "$build/$t-replay.log" | tail -1
    continue
  fi
  if [ "$runs" -gt 0 ]; then
    args+=(-max_total_time="$runs_seconds" -runs="$runs")
    echo "fuzz.sh: $t for $runs executions (log: $build/$t-runs.log)"
    start=$(date +%s)
    if ! "$build/${t}_fuzz" "${args[@]}" "$corpus" "$seeds" >"$build/$t-runs.log" 2>&1; then
      tail -n 40 "$build/$t-runs.log" >&2
      echo "fuzz.sh: $t failed; the input is $build/crash-* (log: $build/$t-runs.log)" >&2
      exit 1
    fi
    echo "fuzz.sh: $t: $(grep -E '^stat::number_of_executed_units' "$build/$t-runs.log" |
      awk '{print $2}') executions in $(( $(date +%s) - start )) s, no crash"
    continue
  fi
  if [ "$jobs" -gt 1 ]; then
    args+=(-jobs="$jobs" -workers="$jobs")
  fi
  "$build/${t}_fuzz" "${args[@]}" "$corpus" "$seeds"
done
