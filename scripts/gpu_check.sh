#!/bin/bash
# The snapshot engine's GPU checks (docs/snapshot.md): builds with the CUDA backend into
# build-cuda/, runs the CUDA tests (GPU fingerprint == CPU fingerprint, staged bytes == device
# bytes, unchanged blocks never copied) and the device benchmark (GIB GiB of device tensors,
# default 8), and prints one table. Needs nvcc (/usr/local/cuda) and an NVIDIA GPU; no network.
# About 3-6 minutes on a 16-core H200 machine.
#
#   scripts/gpu_check.sh [GIB]
set -euo pipefail
cd "$(dirname "$0")/.."
GIB=${1:-8}
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu_check: no nvcc (CUDA toolkit) found" >&2; exit 1; }
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCKPTFS_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null
cmake --build build-cuda -j"$(nproc)" --target ckptfs_snapshot snapshot_unit_tests \
      snapshot_cuda_tests snapshot_gpu_bench
build-cuda/snapshot_unit_tests --gtest_brief=1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here: the CUDA tests skip and the GPU figures are NOT YET MEASURED"
  build-cuda/snapshot_cuda_tests --gtest_brief=1
  exit 0
fi
nvidia-smi -L
build-cuda/snapshot_cuda_tests
OUT=$(mktemp -d /var/tmp/ckptfs-gpu-bench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
build-cuda/snapshot_gpu_bench "$GIB" "$OUT/packs"
