// libFuzzer target for the derived views (engine/views/tensor_view.h, precision_view.h), which
// are built from the untrusted bytes of a stored checkpoint: the input is a whole file, scanned
// into its layout as the store does, then viewed per tensor (as stored and as bfloat16) and at
// each precision (bf16, fp16, fp32), and every view file is read whole in several piece sizes.
// Properties: no crash, UB or exception; failures are error statuses; a virtual file read
// returns exactly the bytes asked for (up to its size), the same bytes whatever the piece size,
// or an error; each source read a view makes lies in a range that SourceRanges reports for the
// bytes read; a precision plan's size is its finished file's size. RewriteTorchPickle is also
// called on the input itself (as a data.pkl).
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/format/layout.h"
#include "engine/views/convert.h"
#include "engine/views/precision_view.h"
#include "engine/views/tensor_view.h"
#include "engine/views/virtual_file.h"

namespace {

using ckptfs::Bytes;
using ckptfs::DType;
using ckptfs::MutableBytes;
using ckptfs::Result;
using ckptfs::SourceReader;
using ckptfs::Status;
using ckptfs::VirtualFile;

constexpr size_t kMaxInputBytes = 1 << 20;
// Views larger than this are not read (a strided tensor can present far more than the input).
constexpr uint64_t kMaxReadBytes = 8 << 20;
// Small piece sizes only for files up to this size (each piece costs a lookup and a source read).
constexpr uint64_t kMaxSmallPieceBytes = 64 << 10;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "views_fuzz: %s\n", what);
  std::abort();
}

// A failure a view may report for bytes it cannot use.
void CheckError(const Status& s, const char* what) {
  if (s.IsCorruption() || s.code() == Status::Code::kNotSupported) return;
  std::fprintf(stderr, "views_fuzz: %s: unexpected status %s\n", what, s.ToString().c_str());
  std::abort();
}

// The input as a source. Reads that a view makes while `allowed` is set must each lie within
// one of the allowed ranges (what SourceRanges says the bytes being read need).
struct Source {
  std::string_view data;
  const std::vector<std::pair<uint64_t, uint64_t>>* allowed = nullptr;

  SourceReader reader() {
    return [this](uint64_t offset, MutableBytes out) -> Result<size_t> {
      if (allowed != nullptr && !out.empty()) {
        bool inside = false;
        for (const auto& [start, length] : *allowed) {
          if (offset >= start && out.size() <= length && offset - start <= length - out.size()) {
            inside = true;
            break;
          }
        }
        Check(inside, "a view read source bytes that SourceRanges does not report");
      }
      if (offset >= data.size()) return size_t{0};
      const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), data.size() - offset));
      std::memcpy(out.data(), data.data() + offset, n);
      return n;
    };
  }
};

// Reads f whole in pieces of `piece` bytes. Returns nullopt when a read fails (with an error
// status: the view maps bytes past the end of the input).
std::optional<std::string> ReadAll(const VirtualFile& f, Source& src, size_t piece) {
  const SourceReader read = src.reader();
  std::string out(static_cast<size_t>(f.size()), '\0');
  std::vector<std::pair<uint64_t, uint64_t>> allowed;
  for (uint64_t at = 0; at < f.size();) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(piece, f.size() - at));
    allowed.clear();
    f.SourceRanges(at, want, [&](uint64_t s, uint64_t n) { allowed.emplace_back(s, n); });
    src.allowed = &allowed;
    Result<size_t> n = f.Read(at, {reinterpret_cast<std::byte*>(out.data() + at), want}, read);
    src.allowed = nullptr;
    if (!n.ok()) {
      CheckError(n.status(), "VirtualFile::Read");
      return std::nullopt;
    }
    Check(*n == want, "VirtualFile::Read returned other than the bytes asked for");
    at += *n;
  }
  // Past the end: nothing.
  std::byte b[4];
  Result<size_t> n = f.Read(f.size(), {b, sizeof(b)}, read);
  Check(n.ok() && *n == 0, "VirtualFile::Read past the end returned bytes");
  return out;
}

// Reads f in several piece sizes; they must agree.
void ReadFile(const VirtualFile& f, Source& src) {
  if (f.size() > kMaxReadBytes) return;
  std::optional<std::string> whole = ReadAll(f, src, 1 << 20);
  std::vector<size_t> pieces = {4096 + 3};
  if (f.size() <= kMaxSmallPieceBytes) pieces.push_back(7);
  for (size_t piece : pieces) {
    std::optional<std::string> got = ReadAll(f, src, piece);
    if (!whole || !got) {
      // Whether a read fails may depend on where the pieces fall only in what it returns
      // before failing; a file either reads whole or not at all.
      Check(whole.has_value() == got.has_value(), "a view reads in one piece size but not another");
      continue;
    }
    Check(*whole == *got, "a view reads differently in another piece size");
  }
  // SourceRanges over the whole file, and over ranges past its end.
  f.SourceRanges(0, f.size(), [](uint64_t, uint64_t) {});
  f.SourceRanges(f.size(), 100, [](uint64_t, uint64_t) { Check(false, "ranges past the end"); });
  f.SourceRanges(0, 0, [](uint64_t, uint64_t) { Check(false, "ranges for no bytes"); });
}

void TensorViews(Source& src, uint64_t size, const std::optional<ckptfs::ContentLayout>& layout,
                 std::optional<DType> to) {
  auto view = ckptfs::BuildTensorView(src.reader(), size, layout, to);
  if (!view.ok()) {
    CheckError(view.status(), "BuildTensorView");
    return;
  }
  const ckptfs::TensorView& v = **view;
  Check(v.by_file.size() == v.tensors.size(), "by_file does not name every tensor");
  Check(v.Find("index.json") == &v.index, "index.json not found");
  ReadFile(v.index, src);
  for (const ckptfs::TensorView::Entry& e : v.tensors) {
    Check(v.Find(e.file) == &e.npy, "an entry's file is not found by its name");
    Check(e.file.size() <= ckptfs::TensorView::kMaxNameBytes, "an entry's name is too long");
    Check(!to || !ckptfs::ConvertsTo(e.dtype, *to), "an entry not converted");
    ReadFile(e.npy, src);
  }
}

void PrecisionViews(Source& src, uint64_t size, const std::optional<ckptfs::ContentLayout>& layout,
                    DType to) {
  auto plan = ckptfs::PlanPrecisionView(src.reader(), size, layout, to);
  if (!plan.ok()) {
    CheckError(plan.status(), "PlanPrecisionView");
    return;
  }
  // Finish reads every converted record for its CRC: bound it as the reads are.
  const uint64_t planned = (*plan)->size();
  if (planned > kMaxReadBytes) return;
  auto file = (*plan)->Finish(src.reader());
  if (!file.ok()) {
    CheckError(file.status(), "PrecisionPlan::Finish");
    return;
  }
  Check((*file)->size() == planned, "a precision plan's size is not its file's size");
  auto again = (*plan)->Finish(src.reader());
  Check(again.ok() && *again == *file, "Finish computed twice");
  ReadFile(**file, src);
}

void Run(std::string_view input) {
  Source src{input};
  const uint64_t size = input.size();
  ckptfs::LayoutScanner scanner;
  Bytes rest = ckptfs::AsBytes(input);
  // Scan returns 0 at a boundary that lies where it stands (safetensors tensors, known in
  // advance); the next call moves on.
  int stalls = 0;
  while (!rest.empty()) {
    const size_t n = scanner.Scan(rest);
    Check(n <= rest.size(), "LayoutScanner::Scan consumed too much");
    if (n == 0) {
      Check(scanner.AtBoundary(), "LayoutScanner::Scan consumed nothing without a boundary");
      Check(++stalls <= 2, "LayoutScanner::Scan consumed nothing again and again");
    } else {
      stalls = 0;
    }
    rest = rest.subspan(n);
  }
  const std::optional<ckptfs::ContentLayout> layout = scanner.TakeLayout();
  for (const ckptfs::LayoutSection& s : layout->sections) {
    Check(s.start <= size && s.size <= size - s.start, "a layout section past the input");
  }

  TensorViews(src, size, layout, std::nullopt);
  TensorViews(src, size, layout, DType::kBF16);
  for (DType to : {DType::kBF16, DType::kF16, DType::kF32}) PrecisionViews(src, size, layout, to);

  // The input as a data.pkl: rewriting it must fail cleanly or give a pickle that rewrites to
  // itself (its storage types already name the target).
  auto converted = [](DType d) { return ckptfs::ConvertsTo(d, DType::kBF16); };
  auto pkl = ckptfs::RewriteTorchPickle(input, DType::kBF16, converted);
  if (!pkl.ok()) {
    CheckError(pkl.status(), "RewriteTorchPickle");
  } else {
    auto twice = ckptfs::RewriteTorchPickle(*pkl, DType::kBF16, converted);
    Check(twice.ok() && *twice == *pkl, "RewriteTorchPickle is not idempotent");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInputBytes) return 0;
  try {
    Run(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "views_fuzz: exception: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "views_fuzz: unknown exception\n");
    std::abort();
  }
  return 0;
}
