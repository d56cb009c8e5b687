// engine/util/read_at.h
//
// Positional reads of a byte source whose bytes come from elsewhere (a stored content, a file,
// a test's string): the parsers of engine/format and the views of engine/views read through it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

// Reads up to `out.size()` bytes at `offset` into `out`; returns how many (fewer only at the
// end of the source).
using ReadAtFn = std::function<Result<size_t>(uint64_t offset, MutableBytes out)>;

// Exactly `n` bytes at `offset`, or Corruption("WHAT: truncated") when the source ends first.
inline Result<std::string> ReadExact(const ReadAtFn& read, uint64_t offset, uint64_t n,
                                     std::string_view what) {
  std::string out(static_cast<size_t>(n), '\0');
  CKPTFS_ASSIGN_OR_RETURN(size_t got,
                          read(offset, {reinterpret_cast<std::byte*>(out.data()), out.size()}));
  if (got != n) return Status::Corruption(std::string(what) + ": truncated");
  return out;
}

}  // namespace ckptfs
