// engine/snapshot/backend.h
//
// Where tensor bytes come from: the CPU backend (host tensors: memcpy staging, the CPU
// fingerprint) is always built; the CUDA backend (cuda/cuda_backend.cu: a cudaHostAlloc ring,
// its own stream, the fingerprint kernel, cudaMemcpyAsync of changed blocks only) is built when
// CMake finds the CUDA toolkit. The engine (snapshot_engine.h) drives either the same way:
//
//   backend->Fingerprints(tensor, block_bytes, &fps);   // one per block, from device memory
//   backend->CopyToHost(tensor, offset, n, ring.at(at), [=] { /* bytes are in the ring */ });
//   backend->Drain();                                   // every copy issued so far landed
//
// Thread-compatible: the engine's staging thread is the only caller (done callbacks may run on
// any thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/snapshot/fingerprint.h"
#include "engine/util/status.h"

namespace ckptfs::snapshot {

// One tensor (or this rank's shard of one) as the caller hands it over.
struct TensorDesc {
  std::string name;
  std::string dtype;           // safetensors dtype: F32, BF16, I64, ...
  std::vector<int64_t> shape;  // of this shard
  const void* data = nullptr;  // host or device memory, contiguous
  int device = -1;             // -1: host memory; else the CUDA device ordinal
  uint64_t nbytes = 0;
  // Partitioned tensors: the whole tensor's shape and this shard's offset in it (empty when the
  // tensor is not partitioned).
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The ring memory (ring_bytes as asked at creation).
  virtual std::byte* ring_memory() = 0;
  // Fingerprints of the tensor's blocks [k * block_bytes, min((k+1) * block_bytes, nbytes)).
  virtual Status Fingerprints(const TensorDesc& t, uint64_t block_bytes,
                              std::vector<Fingerprint>* out) = 0;
  // Copies bytes [offset, offset + n) of the tensor to `dst` (ring memory); `done` runs once
  // they are there, or with an error.
  virtual Status CopyToHost(const TensorDesc& t, uint64_t offset, uint64_t n, std::byte* dst,
                            std::function<void(Status)> done) = 0;
  // Returns once every copy issued so far has landed: the tensors may be modified again.
  virtual Status Drain() = 0;
};

// Host tensors only (device >= 0 is InvalidArgument).
std::unique_ptr<Backend> NewCpuBackend(size_t ring_bytes);
// CUDA tensors and host tensors. NotSupported when this build has no CUDA backend or the
// machine has no CUDA device.
Result<std::unique_ptr<Backend>> NewCudaBackend(size_t ring_bytes);
bool CudaBackendBuilt();

}  // namespace ckptfs::snapshot
