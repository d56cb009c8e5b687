// engine/format/safetensors.h
//
// Reads the header of a safetensors file: an 8-byte little-endian length N, then N bytes of
// JSON naming each tensor's dtype, shape and byte range, then the tensors' bytes.
//
//   Result<size_t> need = SafetensorsHeaderBytes(first_8_bytes);   // 8 + N
//   Result<SafetensorsIndex> index = ParseSafetensorsHeader(prefix); // prefix.size() >= *need
//   for (const SafetensorsTensor& t : index->tensors) Use(t.name, t.begin, t.end);
//
// Checked as the safetensors library checks a file: N at most kMaxHeaderBytes, the JSON an
// object (starting with '{', UTF-8, well formed, trailing spaces allowed) whose members are
// "__metadata__" (an object of strings, or null) and tensors {"dtype": known name, "shape":
// [uint...], "data_offsets": [begin, end]}; each tensor's end - begin is its numel times its
// element size, and the tensors, sorted by offset, tile the data from its first byte with no
// gap or overlap. Unknown members of a tensor are ignored; a name given twice is an error.
// Anything else is Corruption. Whether the file is as long as data_end is the caller's to
// check (the library requires it to be exactly that long).
//
// Input is untrusted: the JSON is read with a SAX parser, so memory is the index plus a few
// words per level of nesting, whatever the header holds. Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/format/dtype.h"
#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;  // empty for a 0-d tensor
  uint64_t begin = 0;           // absolute offsets in the file: [begin, end)
  uint64_t end = 0;
};

struct SafetensorsIndex {
  uint64_t header_bytes = 0;  // N
  uint64_t data_begin = 0;    // 8 + N: where the tensors' bytes start
  uint64_t data_end = 0;      // where the last tensor ends (data_begin when there are none)
  std::vector<SafetensorsTensor> tensors;  // by offset (ties, which are empty: by name)
  std::map<std::string, std::string> metadata;
};

// The safetensors library's limit on N.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// How many bytes from the file's start ParseSafetensorsHeader needs: 8 when given fewer than 8,
// else 8 + N. Corruption when N is over kMaxSafetensorsHeaderBytes.
Result<size_t> SafetensorsHeaderBytes(Bytes file_prefix);

// REQUIRES nothing: a prefix shorter than SafetensorsHeaderBytes(prefix) is Corruption
// ("truncated"); bytes after the header are ignored.
Result<SafetensorsIndex> ParseSafetensorsHeader(Bytes file_prefix);

}  // namespace ckptfs
