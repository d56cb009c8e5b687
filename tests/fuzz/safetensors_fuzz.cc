// libFuzzer target for ParseSafetensorsHeader (engine/format/safetensors.h): any bytes must
// give an index whose tensors tile the data as the header promises, or Corruption, without UB.
// Each input is parsed twice: as a whole file, and with its first 8 bytes replaced by the
// length of the rest, so that mutations of the JSON are read even when they break the length.
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/format/safetensors.h"

namespace {

using ckptfs::Bytes;
using ckptfs::Result;
using ckptfs::SafetensorsIndex;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "safetensors_fuzz: %s\n", what);
  std::abort();
}

void Parse(Bytes file) {
  Result<size_t> need = ckptfs::SafetensorsHeaderBytes(file);
  Result<SafetensorsIndex> index = ckptfs::ParseSafetensorsHeader(file);
  if (!index.ok()) {
    Check(index.status().IsCorruption(), "a status other than Corruption");
    return;
  }
  Check(need.ok() && *need <= file.size(), "parsed from fewer bytes than it needs");
  Check(index->data_begin == *need && index->header_bytes + 8 == *need, "data_begin wrong");
  uint64_t at = index->data_begin;
  for (const ckptfs::SafetensorsTensor& t : index->tensors) {
    Check(t.begin == at && t.end >= t.begin, "tensors do not tile the data");
    uint64_t bytes = ckptfs::ElementSize(t.dtype);
    for (uint64_t d : t.shape) {
      Check(!__builtin_mul_overflow(bytes, d, &bytes), "a tensor's size overflows");
    }
    Check(bytes == t.end - t.begin, "a tensor's bytes are not its numel times its size");
    at = t.end;
  }
  Check(index->data_end == at, "data_end is not the last tensor's end");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Parse(Bytes(reinterpret_cast<const std::byte*>(data), size));
  if (size >= 8) {
    std::vector<std::byte> fixed(size);
    std::memcpy(fixed.data(), data, size);
    const uint64_t n = size - 8;
    std::memcpy(fixed.data(), &n, 8);
    Parse(fixed);
  }
  return 0;
}
