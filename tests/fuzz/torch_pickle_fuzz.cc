// libFuzzer target for ParseTorchPickle (engine/format/torch_pickle.h): any bytes must give an
// index that keeps the header's promises, or a Corruption / InvalidArgument status, within the
// limits and without UB. An input parsed under tight limits must parse the same under loose
// ones. Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/format/torch_pickle.h"

namespace {

using ckptfs::Bytes;
using ckptfs::Result;
using ckptfs::Status;
using ckptfs::TorchPickleIndex;
using ckptfs::TorchPickleLimits;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "torch_pickle_fuzz: %s\n", what);
  std::abort();
}

void CheckIndex(const TorchPickleIndex& index, const TorchPickleLimits& limits) {
  std::map<std::string, const ckptfs::TorchStorage*> storages;
  for (const ckptfs::TorchStorage& s : index.storages) {
    Check(!s.key.empty(), "a storage with an empty key");
    Check(storages.emplace(s.key, &s).second, "a storage key listed twice");
    Check(s.nbytes == s.numel * ckptfs::ElementSize(s.dtype), "nbytes is not numel * size");
  }
  Check(index.tensors.size() <= limits.max_tensors, "more tensors than the limit");
  Check(index.opaque_globals.size() <= TorchPickleIndex::kMaxListedGlobals, "too many globals");
  for (const ckptfs::TorchTensor& t : index.tensors) {
    auto it = storages.find(t.storage_key);
    Check(it != storages.end(), "a tensor of an unlisted storage");
    Check(t.dtype == it->second->dtype, "a tensor's dtype is not its storage's");
    Check(t.shape.size() == t.stride.size(), "shape and stride differ in length");
    Check(t.storage_offset >= 0, "a negative storage offset");
    uint64_t numel = 1, last = 0;  // the parser refuses sizes that overflow these
    for (size_t d = 0; d < t.shape.size(); ++d) {
      Check(t.shape[d] >= 0 && t.stride[d] >= 0, "a negative size or stride");
      const auto size = static_cast<uint64_t>(t.shape[d]);
      uint64_t reach = 0;
      Check(!__builtin_mul_overflow(numel, size, &numel), "numel overflows");
      Check(size == 0 ||
                !__builtin_mul_overflow(size - 1, static_cast<uint64_t>(t.stride[d]), &reach),
            "a tensor's extent overflows");
      Check(!__builtin_add_overflow(last, reach, &last), "a tensor's extent overflows");
    }
    Check(numel == t.numel, "numel is not the product of the shape");
    if (numel > 0) {
      Check(static_cast<uint64_t>(t.storage_offset) + last < it->second->numel,
            "a tensor past its storage's end");
    }
  }
}

bool Same(const TorchPickleIndex& a, const TorchPickleIndex& b) {
  if (a.storages.size() != b.storages.size() || a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.storages.size(); ++i) {
    if (a.storages[i].key != b.storages[i].key || a.storages[i].numel != b.storages[i].numel) {
      return false;
    }
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const ckptfs::TorchTensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.path != y.path || x.storage_key != y.storage_key || x.shape != y.shape ||
        x.stride != y.stride || x.storage_offset != y.storage_offset) {
      return false;
    }
  }
  return true;
}

void CheckStatus(const Status& s) {
  Check(s.IsCorruption() || s.code() == Status::Code::kInvalidArgument,
        "a status other than Corruption or InvalidArgument");
  Check(!s.message().empty(), "a status without a message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Bytes input(reinterpret_cast<const std::byte*>(data), size);
  TorchPickleLimits tight;
  tight.max_objects = 512;
  tight.max_depth = 8;
  tight.max_tensors = 16;
  tight.max_index_bytes = 256;
  TorchPickleLimits loose;
  loose.max_objects = size_t{1} << 20;
  Result<TorchPickleIndex> small = ckptfs::ParseTorchPickle(input, tight);
  Result<TorchPickleIndex> big = ckptfs::ParseTorchPickle(input, loose);
  if (small.ok()) {
    CheckIndex(*small, tight);
    Check(big.ok(), "parsed under tight limits, not under loose ones");
    Check(Same(*small, *big), "tight and loose limits disagree");
  } else {
    CheckStatus(small.status());
    // Corruption is found before any limit is reached, so looser limits find it too.
    Check(!small.status().IsCorruption() || big.status().message() == small.status().message(),
          "corrupt under tight limits, not the same under loose ones");
  }
  if (big.ok()) {
    CheckIndex(*big, loose);
  } else {
    CheckStatus(big.status());
  }
  return 0;
}
