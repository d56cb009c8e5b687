// engine/views/precision_view.h
//
// The precision view of a whole checkpoint file: the same format, with every floating tensor
// (fp64/fp32/fp16/bf16 storage) converted to one target type (engine/views/convert.h), all
// other bytes unchanged in meaning.
//
//   auto plan = PlanPrecisionView(read, size, layout, DType::kBF16);   // cheap: sizes known
//   (*plan)->size();                                                    // for stat
//   CKPTFS_ASSIGN_OR_RETURN(auto file, (*plan)->Finish(read));         // CRCs, once
//   file->Read(offset, out, read);
//
// torch zip: a new archive in the original record order. Converted storage records get their
// new size; data.pkl is rewritten so that the storage types name the new dtype
// (torch.FloatStorage -> torch.BFloat16Storage; numels, offsets, sizes and strides are in
// elements and stay); every local header, the central directory and the zip64 records are
// generated (no data descriptors; data aligned to 64 bytes as torch writes it). torch checks
// each record's CRC-32, so Finish() computes the CRCs of the converted records in one
// streaming pass (4 MiB at a time) and keeps them (a few bytes per record).
// Safetensors: the JSON header is rewritten (dtype, data_offsets), the data converted.
// Files with no floating tensor to convert, or that cannot be parsed, are NotSupported: the
// view presents them unchanged.
// Thread-safe: Finish() may be called concurrently (computed once).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/format/dtype.h"
#include "engine/format/layout.h"
#include "engine/views/virtual_file.h"

namespace ckptfs {

class PrecisionPlan {
 public:
  virtual ~PrecisionPlan() = default;
  // The view's size in bytes.
  virtual uint64_t size() const = 0;
  // The view's bytes (computes what needs a pass over the data the first time).
  virtual Result<std::shared_ptr<const VirtualFile>> Finish(const SourceReader& read) = 0;
  // What the plan holds in memory, roughly (once finished, with its file).
  virtual uint64_t memory_bytes() const = 0;
};

Result<std::shared_ptr<PrecisionPlan>> PlanPrecisionView(const SourceReader& read, uint64_t size,
                                                         const std::optional<ContentLayout>& layout,
                                                         DType to);

// Rewrites a torch pickle so that storage type globals name `to` where `converted(dtype)`.
// Copies every opcode; replaces only GLOBAL 'torch <T>Storage' (and the STACK_GLOBAL form whose
// two strings are pushed just before); drops FRAME opcodes (framing is optional).
// Corruption for anything it cannot follow.
Result<std::string> RewriteTorchPickle(std::string_view pkl, DType to,
                                       const std::function<bool(DType)>& converted);

}  // namespace ckptfs
