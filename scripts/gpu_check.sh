#!/bin/bash
# The snapshot engine's GPU checks (docs/snapshot.md): the CUDA tests (GPU fingerprint == CPU
# fingerprint, staged bytes == device bytes, unchanged blocks never copied), the end-to-end test
# through a real mount with torch CUDA tensors (tests/snapshot/test_snapshot_cuda.py) and the
# device benchmark (GIB GiB of device tensors, default 8). Needs an NVIDIA GPU; no network.
#
#   scripts/gpu_check.sh [GIB]                  build with -DCKPTFS_CUDA=ON into build-cuda/, run
#   scripts/gpu_check.sh --bundle DIR           build here, copy the binaries and the shared
#                                               libraries they need into DIR (for a GPU machine
#                                               that has CUDA and torch but not our build deps)
#   scripts/gpu_check.sh --from DIR [GIB]       run from such a bundle
#
# PYTHON names the interpreter whose torch sees the GPU (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
MODE=build BIN=build-cuda
if [[ ${1:-} == --bundle || ${1:-} == --from ]]; then
  MODE=${1#--} BIN=$2
  shift 2
fi
GIB=${1:-8}

if [[ $MODE != from ]]; then
  command -v nvcc >/dev/null || { echo "gpu_check: no nvcc (CUDA toolkit) found" >&2; exit 1; }
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCKPTFS_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null
  cmake --build build-cuda -j"$(nproc)" --target ckptfs ckptfs_snapshot snapshot_unit_tests \
        snapshot_cuda_tests snapshot_gpu_bench
fi
if [[ $MODE == bundle ]]; then
  rm -rf "$BIN" && mkdir -p "$BIN/lib"
  cp build-cuda/{ckptfs,libckptfs_snapshot.so,snapshot_unit_tests,snapshot_cuda_tests,snapshot_gpu_bench} "$BIN/"
  cp "$(command -v fusermount3)" "$BIN/"
  # Every shared library but the C/C++ runtime (the GPU machine's own are newer).
  ldd "$BIN"/ckptfs "$BIN"/*.so "$BIN"/snapshot_* | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/lib(c|m|dl|rt|pthread|gcc_s|stdc\+\+)\.so' | xargs -I{} cp -L {} "$BIN/lib/"
  du -sh "$BIN"
  exit 0
fi
if [[ $MODE == from ]]; then
  export LD_LIBRARY_PATH="$PWD/$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$PWD/$BIN:$PATH"
fi

"$BIN"/snapshot_unit_tests --gtest_brief=1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here: the CUDA tests skip and the GPU figures are NOT YET MEASURED"
  "$BIN"/snapshot_cuda_tests --gtest_brief=1
  exit 0
fi
nvidia-smi -L
rc=0
"$BIN"/snapshot_cuda_tests || rc=1
CKPTFS="$PWD/$BIN/ckptfs" CKPTFS_SNAPSHOT_LIB="$PWD/$BIN/libckptfs_snapshot.so" \
  PYTHONDONTWRITEBYTECODE=1 "${PYTHON:-python3}" tests/snapshot/test_snapshot_cuda.py || rc=$?
[[ $rc == 0 ]] || echo "gpu_check: a check failed (exit $rc; 77 = the mounted test skipped)"
OUT_DIR=$(mktemp -d /var/tmp/ckptfs-gpu-bench.XXXXXX)
trap 'rm -rf "$OUT_DIR"' EXIT
"$BIN"/snapshot_gpu_bench "$GIB" "$OUT_DIR/packs"
exit $rc
