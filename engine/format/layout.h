// engine/format/layout.h
//
// Where the tensors of a checkpoint file lie, learned while the file streams in, so that the
// writer can cut chunks at tensor boundaries, cut large tensors into fixed pieces, give each
// piece its element width (for byte planes) and find the same piece in the previous version:
//
//   LayoutScanner scanner;
//   while (!data.empty()) {
//     size_t n = scanner.Scan(data);   // up to the byte at which a boundary became known
//     Chunk(data.first(n));
//     if (scanner.AtBoundary()) EndChunkAt(scanner.boundary());  // a section starts or ends
//     data = data.subspan(n);
//   }
//   ContentLayout layout = scanner.TakeLayout();   // stored beside the content
//
// Formats: torch.save's zip (format/torch_zip.h): one section per record, named by the record's
// name ("model/data/3"), typed from data.pkl (format/torch_pickle.h, parsed when its record
// ends; a pickle that does not parse leaves the sections untyped, width 1). Safetensors
// (format/safetensors.h): one section per tensor, named by the tensor's name. Anything else has
// no sections. The scanner holds headers and data.pkl (up to kMaxPickleBytes) and nothing else.
// Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/format/dtype.h"
#include "engine/format/torch_zip.h"
#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

struct LayoutSection {
  std::string name;
  uint64_t start = 0;  // offset of the section's first byte in the file
  uint64_t size = 0;
  std::optional<DType> dtype;  // of the elements, when known
  uint8_t width() const { return dtype ? static_cast<uint8_t>(ElementSize(*dtype)) : 1; }
};

// What identifies a section across versions: its name without the zip's top directory, which
// torch derives from the file name ("v1/data/3" and "v2/data/3" are the same storage).
std::string_view SectionKey(std::string_view name);

struct ContentLayout {
  enum class Format : uint8_t { kNone = 0, kTorchZip = 1, kSafetensors = 2 };
  Format format = Format::kNone;
  std::vector<LayoutSection> sections;  // in file order, not overlapping

  // A compact binary row; Decode returns Corruption for anything Encode did not write.
  std::string Encode() const;
  static Result<ContentLayout> Decode(std::string_view row);
  // The section named `name`, or null.
  const LayoutSection* Find(std::string_view name) const;
};

// What makes two checkpoint files versions of one another whatever their names: the tensors they
// hold, as (SectionKey, size, dtype) of every typed, non-empty section, in key order, hashed
// (XXH3-64). Two files of the same model and optimizer (names, dtypes, shapes) have the same
// signature whatever their tensors' values or their pickles' other contents. nullopt when the
// layout has no typed section.
std::optional<uint64_t> LayoutSignature(const ContentLayout& layout);

class LayoutScanner {
 public:
  // data.pkl records longer than this are not parsed (their sections stay untyped).
  static constexpr size_t kMaxPickleBytes = 64u << 20;
  // Safetensors headers longer than this are not parsed (the file has no sections).
  static constexpr size_t kMaxHeaderBytes = 64u << 20;
  // A boundary is learned at most this many bytes after the offset it names.
  static constexpr size_t kMaxBoundaryLag = TorchZipCutter::kMaxCutLag;

  LayoutScanner();
  ~LayoutScanner();
  LayoutScanner(const LayoutScanner&) = delete;
  LayoutScanner& operator=(const LayoutScanner&) = delete;

  // Consumes bytes up to and including the one at which the next boundary becomes known, or
  // all of them. Returns how many.
  size_t Scan(Bytes data);
  bool AtBoundary() const { return at_boundary_; }
  // REQUIRES: AtBoundary(). Where a chunk should end (boundary() >= offset() - kMaxBoundaryLag).
  uint64_t boundary() const { return boundary_; }
  // The section that bytes from boundary() on belong to, or null between sections.
  // REQUIRES: AtBoundary(); valid until the next Scan.
  const LayoutSection* section() const { return open_ ? &layout_.sections.back() : nullptr; }
  // True once no further boundary can come.
  bool done() const { return format_ == Mode::kDone; }
  // The sections found (a section still open at the end is dropped: its size is unknown).
  ContentLayout TakeLayout();
  // LayoutSignature of the whole file, known early: once data.pkl has been parsed (torch.save
  // writes it before the tensors' records) or the safetensors header; nullopt before, and for
  // files of no known format. Equal to LayoutSignature(TakeLayout()) for a well-formed file.
  std::optional<uint64_t> signature() const { return signature_; }

 private:
  enum class Mode { kDetect, kZip, kSafetensorsHeader, kSafetensors, kDone };
  size_t ScanDetect(Bytes data);
  size_t ScanZip(Bytes data);
  size_t ScanSafetensorsHeader(Bytes data);
  size_t ScanSafetensors(Bytes data);
  void OnZipCut(uint64_t cut);
  void OpenSection(std::string name, uint64_t start, std::optional<DType> dtype);
  void EndSection(uint64_t end);

  Mode format_ = Mode::kDetect;
  std::string head_;  // the first bytes (kDetect), then a safetensors header
  size_t header_need_ = 0;
  TorchZipCutter zip_;
  ContentLayout layout_;
  // Safetensors: the tensors (non-empty, by offset) and the next one to open or close.
  struct Tensor {
    std::string name;
    uint64_t begin, end;
    DType dtype;
  };
  std::vector<Tensor> tensors_;
  size_t next_tensor_ = 0;
  bool open_ = false;  // layout_.sections.back() is open (its end is not known yet)
  bool at_boundary_ = false;
  uint64_t boundary_ = 0;
  uint64_t offset_ = 0;
  // data.pkl while it streams past, then the storages' dtypes by record name.
  bool in_pickle_ = false;
  std::string pickle_;
  std::unordered_map<std::string, DType> storage_dtypes_;
  std::optional<uint64_t> signature_;
};

}  // namespace ckptfs
