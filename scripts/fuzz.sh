#!/usr/bin/env bash
# Fuzzes the torch zip cutter (engine/format/torch_zip.h) with libFuzzer: builds
# tests/fuzz/torch_zip_fuzz with clang-14 (ASan, UBSan) in build-fuzz/, seeds a corpus with
# small real torch.save files and zipfile archives of every layout, and runs for SECONDS.
#
# Usage: scripts/fuzz.sh [SECONDS] [JOBS]   (defaults: 30 seconds, 1 job)
# The corpus grows in build-fuzz/corpus/torch_zip/; a crashing input is saved as
# build-fuzz/crash-* (rerun it with build-fuzz/torch_zip_fuzz FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
jobs="${2:-1}"
build=build-fuzz

if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" --target torch_zip_fuzz -j"$(nproc)" >/dev/null

corpus="$build/corpus/torch_zip"
if [ ! -d "$corpus" ]; then
  mkdir -p "$corpus"
  /usr/bin/python3 scripts/gen_torch_sample.py "$corpus/mlp.pt" --hidden 4
  /usr/bin/python3 - "$corpus/state_dict.pt" <<'PY'
import sys
import torch
torch.manual_seed(0)
torch.save({"w": torch.randn(8, 8), "b": torch.zeros(0), "step": torch.tensor(3)}, sys.argv[1])
PY
  /usr/bin/python3 engine/format/torch_zip_testdata.py zips "$corpus" 1000
fi

args=(-max_total_time="$seconds" -max_len=32768 -dict=tests/fuzz/torch_zip.dict
      -artifact_prefix="$build/" -print_final_stats=1)
if [ "$jobs" -gt 1 ]; then
  args+=(-jobs="$jobs" -workers="$jobs")
fi
exec "$build/torch_zip_fuzz" "${args[@]}" "$corpus"
