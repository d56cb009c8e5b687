// The device benchmark of scripts/gpu_check.sh: a snapshot of GIB GiB of device tensors.
// Prints one table: time until the tensors may be modified (staged) against a plain cudaMemcpy
// to pageable memory and to pinned memory (the limit), D2H GB/s, and the share of copies
// skipped when 90% of the blocks are unchanged. Persist goes to a plain directory (no daemon).
//
//   snapshot_gpu_bench [GIB] [OUT_DIR]
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "engine/snapshot/backend.h"
#include "engine/snapshot/snapshot_engine.h"

using namespace ckptfs::snapshot;
using Clock = std::chrono::steady_clock;

namespace {

__global__ void Fill(uint64_t* p, uint64_t words, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    p[i] = FpMix(i ^ seed);
  }
}

// Changes one word in every block whose index % 10 == 0 (10% of the blocks).
__global__ void Touch(unsigned char* p, uint64_t blocks, uint64_t block_bytes) {
  uint64_t b = (blockIdx.x * uint64_t{blockDim.x} + threadIdx.x) * 10;
  if (b < blocks) p[b * block_bytes] ^= 0x5a;
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

#define CHECK(x)                                                    \
  do {                                                              \
    cudaError_t e_ = (x);                                           \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  const uint64_t gib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8;
  const std::filesystem::path out = argc > 2 ? argv[2] : "/tmp/ckptfs-gpu-bench";
  const uint64_t total = gib << 30, tensor_bytes = 256ull << 20, block = 1 << 20;
  const uint64_t n = total / tensor_bytes;
  std::vector<unsigned char*> dev(n);
  for (auto& d : dev) {
    CHECK(cudaMalloc(&d, tensor_bytes));
    Fill<<<1024, 256>>>(reinterpret_cast<uint64_t*>(d), tensor_bytes / 8,
                        uint64_t(&d - dev.data()));
  }
  CHECK(cudaDeviceSynchronize());

  auto copy_all = [&](unsigned char* host) {
    auto t = Clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      CHECK(cudaMemcpy(host + i * tensor_bytes, dev[i], tensor_bytes, cudaMemcpyDeviceToHost));
    }
    return Since(t);
  };
  double pageable, pinned;
  {
    auto* host = static_cast<unsigned char*>(std::malloc(total));
    std::memset(host, 1, total);  // faulted in: the peer at its best
    copy_all(host);               // warm-up
    pageable = copy_all(host);
    std::free(host);
  }
  {
    void* host;
    CHECK(cudaHostAlloc(&host, total, cudaHostAllocDefault));
    copy_all(static_cast<unsigned char*>(host));
    pinned = copy_all(static_cast<unsigned char*>(host));
    CHECK(cudaFreeHost(host));
  }

  // Where staging time goes: the parts of the engine's staging, each alone on the backend.
  double fp_seconds, pattern_seconds;
  {
    auto backend = NewCudaBackend(256ull << 20);
    if (!backend.ok()) {
      std::fprintf(stderr, "backend: %s\n", backend.status().ToString().c_str());
      return 1;
    }
    std::vector<TensorDesc> ts;
    for (uint64_t i = 0; i < n; ++i) {
      ts.push_back({"t", "U8", {int64_t(tensor_bytes)}, dev[i], 0, tensor_bytes, {}, {}});
    }
    std::vector<Fingerprint> fps;
    auto t = Clock::now();
    for (const auto& td : ts) {
      if (!(*backend)->Fingerprints(td, block, &fps).ok()) std::exit(1);
    }
    fp_seconds = Since(t);
    const uint64_t piece = 64ull << 20;  // EngineOptions::max_copy_bytes
    std::atomic<uint64_t> landed{0};
    t = Clock::now();
    for (const auto& td : ts) {
      for (uint64_t off = 0; off < tensor_bytes; off += piece) {
        std::byte* dst = (*backend)->ring_memory() + (off % (256ull << 20));
        if (!(*backend)->CopyToHost(td, off, piece, dst, [&](ckptfs::Status) { ++landed; }).ok())
          std::exit(1);
      }
    }
    if (!(*backend)->Drain().ok()) std::exit(1);
    pattern_seconds = Since(t);
  }

  std::filesystem::remove_all(out);
  EngineOptions o;
  o.backend = BackendKind::kCuda;
  o.block_bytes = block;
  o.ring_bytes = total + (256ull << 20);  // the whole state fits: staging never waits for disk
  o.codec = *ckptfs::CodecSpec::Parse("none");
  auto engine = Engine::Open(NewDirSink(out), 0, 1, o);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<TensorDesc> tensors;
  for (uint64_t i = 0; i < n; ++i) {
    std::string name = "t";
    name += std::to_string(i);  // (not "t" + ...: GCC 12's -Wrestrict false positive)
    tensors.push_back({name, "U8", {int64_t(tensor_bytes)}, dev[i], 0, tensor_bytes, {}, {}});
  }
  auto run = [&](const char* version, SnapshotStats* st) {
    auto t = Clock::now();
    auto s = *(*engine)->Start(version, tensors);
    if (!s->WaitStaged().ok()) std::exit(1);
    double staged = Since(t);
    ckptfs::Status w = s->Wait();
    if (!w.ok()) {
      std::fprintf(stderr, "snapshot: %s\n", w.ToString().c_str());
      std::exit(1);
    }
    *st = s->stats();
    return std::make_pair(staged, Since(t));
  };
  SnapshotStats s1, s2;
  auto [staged1, done1] = run("v1", &s1);
  for (auto* d : dev)
    Touch<<<(tensor_bytes / block / 10 + 255) / 256 + 1, 256>>>(d, tensor_bytes / block, block);
  CHECK(cudaDeviceSynchronize());
  auto [staged2, done2] = run("v2", &s2);
  const double gb = double(total) / 1e9;
  std::printf("| measurement (%llu GiB of device tensors, %llu x 256 MiB) | value |\n|---|---|\n",
              (unsigned long long)gib, (unsigned long long)n);
  std::printf("| cudaMemcpy D2H to pageable memory | %.3f s (%.1f GB/s) |\n", pageable,
              gb / pageable);
  std::printf("| cudaMemcpy D2H to pinned memory (the limit) | %.3f s (%.1f GB/s) |\n", pinned,
              gb / pinned);
  std::printf(
      "| snapshot 1, all blocks new: staged | %.3f s (%.1f GB/s) = **%.2fx** pinned (target <= "
      "1.25x) |\n",
      staged1, gb / staged1, staged1 / pinned);
  std::printf("| staging's parts alone: fingerprint kernels of every block | %.3f s |\n",
              fp_seconds);
  std::printf("| staging's parts alone: 64 MiB cudaMemcpyAsync + landed callback each | %.3f s "
              "(%.2fx pinned) |\n",
              pattern_seconds, pattern_seconds / pinned);
  std::printf("| snapshot 1: durable in a directory (no compression) | %.3f s |\n", done1);
  std::printf("| snapshot 2, 10%% of blocks changed: staged | %.3f s (%.2fx pinned full copy) |\n",
              staged2, staged2 / pinned);
  std::printf("| snapshot 2: blocks unchanged / all | %llu / %llu = %.1f%% copies skipped |\n",
              (unsigned long long)s2.blocks_unchanged, (unsigned long long)s2.blocks,
              100.0 * double(s2.blocks_unchanged) / double(s2.blocks));
  std::printf("| snapshot 2: bytes copied | %llu (expected %llu) %s |\n",
              (unsigned long long)s2.bytes_copied,
              (unsigned long long)((s2.blocks - s2.blocks_unchanged) * block),
              s2.bytes_copied == (s2.blocks - s2.blocks_unchanged) * block ? "ok" : "MISMATCH");
  std::filesystem::remove_all(out);
  for (auto* d : dev) cudaFree(d);
  return s2.bytes_copied == (s2.blocks - s2.blocks_unchanged) * block ? 0 : 1;
}
