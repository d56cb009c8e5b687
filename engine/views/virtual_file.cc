#include "engine/views/virtual_file.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/views/convert.h"

namespace ckptfs {
namespace {

constexpr uint64_t kConvertBlockElements = 64 * 1024;
constexpr uint64_t kGatherWindowBytes = 4 << 20;

Status ReadExact(const SourceReader& source, uint64_t offset, MutableBytes out) {
  CKPTFS_ASSIGN_OR_RETURN(size_t n, source(offset, out));
  if (n != out.size()) return Status::Corruption("view source is shorter than its layout");
  return Status::OK();
}

// The source bytes [first, last) that elements [e0, e1] (C order, e0 <= e1 < numel) of the
// tensor lie in, bounded without visiting them: dimensions before the first one where e0's and
// e1's indices differ are fixed; in that one the index runs from e0's to e1's, and every later
// one may take any index. (Strides are >= 0.) A read of a few elements of a large strided
// tensor thus reads and prefetches the bytes around those elements, not the rest of the tensor.
std::pair<uint64_t, uint64_t> GatherSpan(const StridedSource& t, uint64_t e0, uint64_t e1) {
  const size_t dims = t.shape.size();
  std::vector<uint64_t> i0(dims), i1(dims);
  for (size_t d = dims; d-- > 0;) {
    const auto n = static_cast<uint64_t>(t.shape[d]);
    i0[d] = e0 % n;
    i1[d] = e1 % n;
    e0 /= n;
    e1 /= n;
  }
  uint64_t lo = 0, hi = 0;  // in elements from base
  size_t d = 0;
  for (; d < dims && i0[d] == i1[d]; ++d) {
    lo += i0[d] * static_cast<uint64_t>(t.stride[d]);
  }
  hi = lo;
  if (d < dims) {
    lo += i0[d] * static_cast<uint64_t>(t.stride[d]);
    hi += i1[d] * static_cast<uint64_t>(t.stride[d]);
    for (++d; d < dims; ++d) {
      hi += static_cast<uint64_t>(t.shape[d] - 1) * static_cast<uint64_t>(t.stride[d]);
    }
  }
  const uint64_t w = ElementSize(t.dtype);
  return {t.base + lo * w, t.base + (hi + 1) * w};
}

}  // namespace

void VirtualFile::Add(Piece p) {
  if (p.size == 0) return;
  p.offset = size_;
  size_ += p.size;
  pieces_.push_back(std::move(p));
}

void VirtualFile::AddBytes(std::string bytes) {
  Piece p;
  p.kind = Piece::Kind::kBytes;
  p.size = bytes.size();
  p.bytes = std::make_shared<const std::string>(std::move(bytes));
  Add(std::move(p));
}

void VirtualFile::AddCopy(uint64_t source, uint64_t size) {
  if (!pieces_.empty() && pieces_.back().kind == Piece::Kind::kCopy &&
      pieces_.back().source + pieces_.back().size == source) {
    pieces_.back().size += size;  // adjacent ranges: one piece
    size_ += size;
    return;
  }
  Piece p;
  p.kind = Piece::Kind::kCopy;
  p.size = size;
  p.source = source;
  Add(std::move(p));
}

void VirtualFile::AddConvert(uint64_t source, uint64_t elements, DType from, DType to) {
  if (from == to) return AddCopy(source, elements * ElementSize(from));
  Piece p;
  p.kind = Piece::Kind::kConvert;
  p.size = elements * ElementSize(to);
  p.source = source;
  p.from = from;
  p.to = to;
  Add(std::move(p));
}

void VirtualFile::AddGather(StridedSource tensor) {
  uint64_t numel = 1;
  for (int64_t d : tensor.shape) numel *= static_cast<uint64_t>(d);
  Piece p;
  p.kind = Piece::Kind::kGather;
  p.size = numel * ElementSize(tensor.to);
  p.source = tensor.base;
  p.gather = std::make_shared<const StridedSource>(std::move(tensor));
  Add(std::move(p));
}

Result<size_t> VirtualFile::Read(uint64_t offset, MutableBytes out,
                                 const SourceReader& source) const {
  if (offset >= size_ || out.empty()) return size_t{0};
  out = out.first(static_cast<size_t>(std::min<uint64_t>(out.size(), size_ - offset)));
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                             [](uint64_t off, const Piece& p) { return off < p.offset; });
  --it;  // the piece holding offset
  size_t done = 0;
  for (; done < out.size(); ++it) {
    const uint64_t at = offset + done - it->offset;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size() - done, it->size - at));
    CKPTFS_RETURN_IF_ERROR(ReadPiece(*it, at, out.subspan(done, n), source));
    done += n;
  }
  return done;
}

Status VirtualFile::ReadPiece(const Piece& p, uint64_t at, MutableBytes out,
                              const SourceReader& source) const {
  switch (p.kind) {
    case Piece::Kind::kBytes:
      std::memcpy(out.data(), p.bytes->data() + at, out.size());
      return Status::OK();
    case Piece::Kind::kCopy:
      return ReadExact(source, p.source + at, out);
    case Piece::Kind::kConvert: {
      const uint64_t win = ElementSize(p.from), wout = ElementSize(p.to);
      uint64_t elem = at / wout;
      size_t skip = static_cast<size_t>(at % wout);
      size_t done = 0;
      Buffer in, conv;
      while (done < out.size()) {
        const uint64_t want = (skip + out.size() - done + wout - 1) / wout;
        const uint64_t count = std::min(want, kConvertBlockElements);
        in.Resize(static_cast<size_t>(count * win));
        conv.Resize(static_cast<size_t>(count * wout));
        CKPTFS_RETURN_IF_ERROR(ReadExact(source, p.source + elem * win, in.mutable_bytes()));
        ConvertElements(p.from, p.to, in.data(), static_cast<size_t>(count), conv.data());
        const size_t n = std::min(out.size() - done, conv.size() - skip);
        std::memcpy(out.data() + done, conv.data() + skip, n);
        done += n;
        elem += count;
        skip = 0;
      }
      return Status::OK();
    }
    case Piece::Kind::kGather:
      return ReadGather(*p.gather, at, out, source);
  }
  return Status::Corruption("unknown piece kind");
}

// Elements in C order, each run of source-contiguous elements read through a bounded window.
Status VirtualFile::ReadGather(const StridedSource& t, uint64_t at, MutableBytes out,
                               const SourceReader& source) {
  const size_t win = ElementSize(t.dtype), wout = ElementSize(t.to);
  const size_t dims = t.shape.size();
  // Only the source bytes of the elements asked for: read at once when they fit the window.
  const auto [span_begin, span_end] = GatherSpan(t, at / wout, (at + out.size() - 1) / wout);
  const bool one_window = span_end - span_begin <= kGatherWindowBytes;
  uint64_t elem = at / wout;
  size_t skip = static_cast<size_t>(at % wout);
  std::vector<int64_t> idx(dims);  // the multi-index of elem
  for (size_t d = dims; d-- > 0;) {
    idx[d] = static_cast<int64_t>(elem % static_cast<uint64_t>(t.shape[d]));
    elem /= static_cast<uint64_t>(t.shape[d]);
  }
  Buffer window, conv;
  uint64_t window_start = 0;
  size_t done = 0;
  while (done < out.size()) {
    uint64_t src = t.base;
    for (size_t d = 0; d < dims; ++d) {
      src += static_cast<uint64_t>(idx[d]) * static_cast<uint64_t>(t.stride[d]) * win;
    }
    // The rest of the innermost dimension is one run when it is contiguous in the source.
    uint64_t run = 1;
    if (dims > 0 && t.stride[dims - 1] == 1) {
      run = static_cast<uint64_t>(t.shape[dims - 1] - idx[dims - 1]);
    }
    run = std::min<uint64_t>(run, (skip + out.size() - done + wout - 1) / wout);
    const uint64_t run_bytes = run * win;
    if (src < window_start || src + run_bytes > window_start + window.size()) {
      window_start = one_window ? span_begin : src;
      window.Resize(static_cast<size_t>(
          std::max(run_bytes, std::min(kGatherWindowBytes, span_end - window_start))));
      CKPTFS_RETURN_IF_ERROR(ReadExact(source, window_start, window.mutable_bytes()));
    }
    conv.Resize(static_cast<size_t>(run * wout));
    ConvertElements(t.dtype, t.to, window.data() + (src - window_start), static_cast<size_t>(run),
                    conv.data());
    const size_t n = std::min(out.size() - done, conv.size() - skip);
    std::memcpy(out.data() + done, conv.data() + skip, n);
    done += n;
    skip = 0;
    uint64_t carry = run;  // advance the index by the run
    for (size_t d = dims; d-- > 0 && carry > 0;) {
      const uint64_t v = static_cast<uint64_t>(idx[d]) + carry;
      idx[d] = static_cast<int64_t>(v % static_cast<uint64_t>(t.shape[d]));
      carry = v / static_cast<uint64_t>(t.shape[d]);
    }
  }
  return Status::OK();
}

void VirtualFile::SourceRanges(uint64_t offset, uint64_t length,
                               const std::function<void(uint64_t, uint64_t)>& fn) const {
  if (offset >= size_ || length == 0) return;
  const uint64_t end = offset + std::min(length, size_ - offset);
  // The piece holding offset, found as Read finds it: a read in small pieces of a file of many
  // pieces (a view of a checkpoint with thousands of tensors) must not scan them all each time.
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                             [](uint64_t off, const Piece& p) { return off < p.offset; });
  for (--it; it != pieces_.end() && it->offset < end; ++it) {
    const Piece& p = *it;
    const uint64_t a = std::max(offset, p.offset) - p.offset;
    const uint64_t b = std::min(end, p.offset + p.size) - p.offset;
    switch (p.kind) {
      case Piece::Kind::kBytes:
        break;
      case Piece::Kind::kCopy:
        fn(p.source + a, b - a);
        break;
      case Piece::Kind::kConvert: {
        const uint64_t win = ElementSize(p.from), wout = ElementSize(p.to);
        const uint64_t e0 = a / wout, e1 = (b + wout - 1) / wout;
        fn(p.source + e0 * win, (e1 - e0) * win);
        break;
      }
      case Piece::Kind::kGather: {
        const uint64_t wout = ElementSize(p.gather->to);
        const auto [first, last] = GatherSpan(*p.gather, a / wout, (b - 1) / wout);
        fn(first, last - first);
        break;
      }
    }
  }
}

uint64_t VirtualFile::memory_bytes() const {
  uint64_t n = sizeof(*this) + pieces_.capacity() * sizeof(Piece);
  for (const Piece& p : pieces_) {
    if (p.bytes) n += p.bytes->capacity();
    if (p.gather) n += sizeof(StridedSource) + 16 * p.gather->shape.size();
  }
  return n;
}

}  // namespace ckptfs
