// engine/views/tensor_view.h
//
// The per-tensor view of a stored checkpoint file (a torch.save zip or a safetensors file):
// one .npy file per tensor, named by the tensor's key path, plus index.json.
//
//   SourceReader read = ...;   // the stored content's bytes
//   Result<std::shared_ptr<const TensorView>> view = BuildTensorView(read, size, layout, {});
//   const VirtualFile* f = (*view)->Find("module.layers.0.weight.npy");
//
// Each .npy is C order (version 1.0 header, or 2.0 when the header needs it). A contiguous
// tensor is one range of the content; a tensor that is a strided or offset view into a shared
// storage is gathered element run by element run. bfloat16 has no numpy dtype: its .npy has
// descr '<u2' holding the raw bits (index.json says "bfloat16"); float8 types are '|u1'.
// With `to` set, floating tensors (fp64/fp32/fp16/bf16) are presented converted to `to`
// (engine/views/convert.h); others are unchanged.
//
// index.json: {"format": "torch"|"safetensors", "tensors": [{"name", "file", "dtype",
// "shape", "bytes" (data bytes), "header_bytes" (where the data starts in the .npy)}, ...]}.
// A tensor whose escaped name is longer than kMaxNameBytes is left out.
//
// Returns NotSupported when the content is not a checkpoint this can parse (no layout, a
// garbage pickle, a truncated header): then it simply has no views.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/format/dtype.h"
#include "engine/format/layout.h"
#include "engine/views/virtual_file.h"

namespace ckptfs {

struct TensorView {
  static constexpr size_t kMaxNameBytes = 250;
  struct Entry {
    std::string name;           // key path: "module.layers.0.weight"
    std::string file;           // its file name in the view: escaped name + ".npy"
    DType dtype = DType::kF32;  // as presented
    std::vector<uint64_t> shape;
    VirtualFile npy;
  };
  ContentLayout::Format format = ContentLayout::Format::kNone;
  std::vector<Entry> tensors;  // in file order
  VirtualFile index;           // index.json
  std::map<std::string, size_t, std::less<>> by_file;

  // The file named `name` ("index.json" or an entry's file), or null.
  const VirtualFile* Find(std::string_view name) const;
  // What this view holds in memory, roughly (the namespace bounds its cache by it).
  uint64_t memory_bytes() const;
};

// The .npy header (magic to '\n', padded to a multiple of 64) for a C-order array.
std::string NpyHeader(DType dtype, const std::vector<uint64_t>& shape);
// The numpy descr used for dtype in views: NumpyDescr, or raw unsigned bits where numpy lacks
// the type ("<u2" for bfloat16, "|u1" for float8).
std::string_view ViewNumpyDescr(DType dtype);
// A key path as a file name: '%' and '/' are percent-encoded, "" becomes "tensor".
std::string EscapeTensorName(std::string_view name);

// Reads the data.pkl record of a torch zip (per its layout). NotSupported without one.
Result<std::string> ReadTorchPickle(const SourceReader& read, const ContentLayout& layout,
                                    std::string* archive_prefix);

Result<std::shared_ptr<const TensorView>> BuildTensorView(
    const SourceReader& read, uint64_t size, const std::optional<ContentLayout>& layout,
    std::optional<DType> to);

}  // namespace ckptfs
