// CUDA backend tests: the GPU fingerprint equals the CPU one, staged bytes equal device bytes,
// and unchanged device blocks are never copied. Skipped where no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/snapshot/backend.h"
#include "engine/snapshot/snapshot_engine.h"

namespace ckptfs::snapshot {
namespace {

bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_DEVICE() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device"

std::vector<unsigned char> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(CudaBackend, GpuFingerprintEqualsCpuFingerprint) {
  REQUIRE_DEVICE();
  auto backend = NewCudaBackend(1 << 20);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto host = Random((3 << 20) + 12345, 1);
  unsigned char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size() + 8), cudaSuccess);
  for (size_t shift : {0, 1, 5}) {  // aligned and unaligned tensors
    ASSERT_EQ(cudaMemcpy(dev + shift, host.data(), host.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    // A cudaMemcpy from pageable memory may return before its DMA landed, and the backend's
    // streams do not wait for the legacy stream: the producer synchronises first, as
    // ckptfs.snapshot does with torch.cuda.synchronize() (without this, the tail blocks of
    // the H200 run read the previous shift's bytes).
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (uint64_t bs : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{1000003}}) {
      TensorDesc t{"t", "U8", {int64_t(host.size())}, dev + shift, 0, host.size(), {}, {}};
      std::vector<Fingerprint> gpu;
      ASSERT_TRUE((*backend)->Fingerprints(t, bs, &gpu).ok());
      ASSERT_EQ(gpu.size(), (host.size() + bs - 1) / bs);
      for (size_t b = 0; b < gpu.size(); ++b) {
        size_t len = std::min<size_t>(bs, host.size() - b * bs);
        EXPECT_EQ(gpu[b], FingerprintBlock(host.data() + b * bs, len))
            << "block " << b << " of " << bs << " shift " << shift;
      }
    }
  }
  cudaFree(dev);
}

TEST(CudaBackend, StagedBytesEqualDeviceBytes) {
  REQUIRE_DEVICE();
  auto backend = NewCudaBackend(8 << 20);
  ASSERT_TRUE(backend.ok());
  auto host = Random(5 << 20, 2);
  unsigned char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the producer's part (see above)
  TensorDesc t{"t", "U8", {int64_t(host.size())}, dev, 0, host.size(), {}, {}};
  std::byte* ring = (*backend)->ring_memory();
  std::atomic<int> landed{0};
  ASSERT_TRUE((*backend)
                  ->CopyToHost(t, 12345, 3 << 20, ring,
                               [&](Status s) {
                                 EXPECT_TRUE(s.ok());
                                 ++landed;
                               })
                  .ok());
  ASSERT_TRUE((*backend)->Drain().ok());
  for (int i = 0; i < 1000 && landed == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(landed.load(), 1);
  EXPECT_EQ(std::memcmp(ring, host.data() + 12345, 3 << 20), 0);
  cudaFree(dev);
}

// Callbacks run on the backend's completion thread, in the order the copies landed, and Drain
// returns only once every one of them has returned (the engine counts on it).
TEST(CudaBackend, DrainWaitsForEveryCallback) {
  REQUIRE_DEVICE();
  auto backend = NewCudaBackend(64 << 20);
  ASSERT_TRUE(backend.ok());
  unsigned char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemset(dev, 7, 64 << 20), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  TensorDesc t{"t", "U8", {int64_t(64 << 20)}, dev, 0, 64 << 20, {}, {}};
  std::mutex mu;
  std::vector<int> order;
  constexpr int kCopies = 64;
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE((*backend)
                    ->CopyToHost(t, uint64_t(i) << 20, 1 << 20,
                                 (*backend)->ring_memory() + (uint64_t(i) << 20),
                                 [&, i](Status s) {
                                   EXPECT_TRUE(s.ok());
                                   std::this_thread::sleep_for(std::chrono::microseconds(200));
                                   std::lock_guard lock(mu);
                                   order.push_back(i);
                                 })
                    .ok());
  }
  ASSERT_TRUE((*backend)->Drain().ok());
  std::lock_guard lock(mu);
  ASSERT_EQ(order.size(), size_t(kCopies));
  for (int i = 0; i < kCopies; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ((*backend)->ring_memory()[(64 << 20) - 1], std::byte{7});
  cudaFree(dev);
}

TEST(CudaBackend, UnchangedDeviceBlocksAreNeverCopied) {
  REQUIRE_DEVICE();
  auto dir = std::filesystem::temp_directory_path() / "ckptfs-cuda-test";
  std::filesystem::remove_all(dir);
  EngineOptions o;
  o.backend = BackendKind::kCuda;
  o.block_bytes = 1 << 20;
  o.ring_bytes = 64 << 20;
  auto engine = Engine::Open(NewDirSink(dir), 0, 1, o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto host = Random(16 << 20, 3);
  unsigned char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the producer's part (see above)
  TensorDesc t{"t", "U8", {int64_t(host.size())}, dev, 0, host.size(), {}, {}};
  auto s1 = *(*engine)->Start("v1", {t});
  ASSERT_TRUE(s1->Wait().ok());
  EXPECT_EQ(s1->stats().bytes_copied, host.size());
  unsigned char one = 1;
  for (size_t b = 0; b < 16; b += 4) {  // change blocks 0, 4, 8, 12
    ASSERT_EQ(cudaMemcpy(dev + b * (1 << 20) + 7, &one, 1, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto s2 = *(*engine)->Start("v2", {t});
  ASSERT_TRUE(s2->Wait().ok());
  EXPECT_EQ(s2->stats().blocks_unchanged, 12u);
  EXPECT_EQ(s2->stats().bytes_copied, 4u << 20);
  cudaFree(dev);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckptfs::snapshot
