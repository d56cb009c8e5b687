// The CPU backend: host tensors, staged with memcpy, fingerprinted with FingerprintBlock.
#include <cstring>

#include "engine/snapshot/backend.h"

namespace ckptfs::snapshot {
namespace {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(size_t ring_bytes) : ring_(new std::byte[ring_bytes]) {}
  std::string name() const override { return "cpu"; }
  std::byte* ring_memory() override { return ring_.get(); }

  Status Fingerprints(const TensorDesc& t, uint64_t block_bytes,
                      std::vector<Fingerprint>* out) override {
    if (t.device >= 0) return Status::InvalidArgument(t.name + " is in device memory");
    out->clear();
    const auto* p = static_cast<const std::byte*>(t.data);
    for (uint64_t off = 0; off < t.nbytes; off += block_bytes) {
      out->push_back(FingerprintBlock(p + off, std::min(block_bytes, t.nbytes - off)));
    }
    return Status::OK();
  }

  Status CopyToHost(const TensorDesc& t, uint64_t offset, uint64_t n, std::byte* dst,
                    std::function<void(Status)> done) override {
    if (t.device >= 0) return Status::InvalidArgument(t.name + " is in device memory");
    std::memcpy(dst, static_cast<const std::byte*>(t.data) + offset, n);
    done(Status::OK());
    return Status::OK();
  }

  Status Drain() override { return Status::OK(); }

 private:
  std::unique_ptr<std::byte[]> ring_;
};

}  // namespace

std::unique_ptr<Backend> NewCpuBackend(size_t ring_bytes) {
  return std::make_unique<CpuBackend>(ring_bytes);
}

}  // namespace ckptfs::snapshot
