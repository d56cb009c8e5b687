#include "engine/format/layout.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "engine/format/safetensors.h"
#include "engine/format/torch_pickle.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

constexpr uint8_t kLayoutRowVersion = 1;
constexpr uint8_t kNoDType = 0xff;
constexpr std::string_view kPickleSuffix = "data.pkl";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The signature of (key, size, dtype) entries: sorted, then hashed.
using SignatureEntry = std::tuple<std::string, uint64_t, DType>;
std::optional<uint64_t> SignatureOf(std::vector<SignatureEntry> entries) {
  if (entries.empty()) return std::nullopt;
  std::sort(entries.begin(), entries.end());
  std::string bytes;
  for (const auto& [key, size, dtype] : entries) {
    char buf[8];
    bytes.append(key);
    bytes.push_back('\0');
    PutLE<uint64_t>(buf, size);
    bytes.append(buf, 8);
    bytes.push_back(static_cast<char>(dtype));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

std::optional<uint64_t> LayoutSignature(const ContentLayout& layout) {
  std::vector<SignatureEntry> entries;
  for (const LayoutSection& s : layout.sections) {
    if (s.dtype && s.size > 0)
      entries.emplace_back(std::string(SectionKey(s.name)), s.size, *s.dtype);
  }
  return SignatureOf(std::move(entries));
}

std::string_view SectionKey(std::string_view name) {
  const size_t slash = name.find('/');
  return slash == std::string_view::npos ? name : name.substr(slash + 1);
}

std::string ContentLayout::Encode() const {
  std::string row;
  row.push_back(static_cast<char>(kLayoutRowVersion));
  row.push_back(static_cast<char>(format));
  char buf[8];
  PutLE<uint32_t>(buf, static_cast<uint32_t>(sections.size()));
  row.append(buf, 4);
  for (const LayoutSection& s : sections) {
    PutLE<uint16_t>(buf, static_cast<uint16_t>(s.name.size()));
    row.append(buf, 2);
    row.append(s.name);
    PutLE<uint64_t>(buf, s.start);
    row.append(buf, 8);
    PutLE<uint64_t>(buf, s.size);
    row.append(buf, 8);
    row.push_back(static_cast<char>(s.dtype ? static_cast<uint8_t>(*s.dtype) : kNoDType));
  }
  return row;
}

Result<ContentLayout> ContentLayout::Decode(std::string_view row) {
  const auto bad = [] { return Status::Corruption("content layout row is malformed"); };
  if (row.size() < 6 || static_cast<uint8_t>(row[0]) != kLayoutRowVersion ||
      static_cast<uint8_t>(row[1]) > static_cast<uint8_t>(Format::kSafetensors)) {
    return bad();
  }
  ContentLayout layout;
  layout.format = static_cast<Format>(row[1]);
  const uint32_t count = GetLE<uint32_t>(row.data() + 2);
  size_t pos = 6;
  if (count > row.size() / 19) return bad();  // each section takes at least 19 bytes
  layout.sections.reserve(count);
  uint64_t end = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (row.size() - pos < 2) return bad();
    const size_t name_len = GetLE<uint16_t>(row.data() + pos);
    pos += 2;
    if (row.size() - pos < name_len + 17) return bad();
    LayoutSection s;
    s.name.assign(row.data() + pos, name_len);
    pos += name_len;
    s.start = GetLE<uint64_t>(row.data() + pos);
    s.size = GetLE<uint64_t>(row.data() + pos + 8);
    const uint8_t dtype = static_cast<uint8_t>(row[pos + 16]);
    pos += 17;
    if (dtype != kNoDType) {
      if (dtype >= kNumDTypes) return bad();
      s.dtype = static_cast<DType>(dtype);
    }
    if (s.start < end || s.size > UINT64_MAX - s.start) return bad();
    end = s.start + s.size;
    layout.sections.push_back(std::move(s));
  }
  if (pos != row.size()) return bad();
  return layout;
}

const LayoutSection* ContentLayout::Find(std::string_view name) const {
  for (const LayoutSection& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

LayoutScanner::LayoutScanner() = default;
LayoutScanner::~LayoutScanner() = default;

size_t LayoutScanner::Scan(Bytes data) {
  at_boundary_ = false;
  size_t n = data.size();
  switch (format_) {
    case Mode::kDetect:
      n = ScanDetect(data);
      break;
    case Mode::kZip:
      n = ScanZip(data);
      break;
    case Mode::kSafetensorsHeader:
      n = ScanSafetensorsHeader(data);
      break;
    case Mode::kSafetensors:
      n = ScanSafetensors(data);
      break;
    case Mode::kDone:
      break;
  }
  offset_ += n;
  return n;
}

// A zip starts with a local header signature; a safetensors file with an 8-byte length and '{'.
size_t LayoutScanner::ScanDetect(Bytes data) {
  constexpr size_t kNeed = 9;
  const size_t n = std::min(data.size(), kNeed - head_.size());
  head_.append(AsChars(data.first(n)));
  const Bytes head = AsBytes(head_);
  if (head_.size() >= 4 && std::memcmp(head_.data(), "PK\3\4", 4) == 0) {
    format_ = Mode::kZip;
    (void)zip_.Scan(head);  // no cut lies within a header's first bytes
    head_.clear();
    return n;
  }
  if (head_.size() < kNeed) return n;
  auto need = SafetensorsHeaderBytes(head);
  if (head_[8] == '{' && need.ok() && *need <= kMaxHeaderBytes + 8) {
    format_ = Mode::kSafetensorsHeader;
    header_need_ = *need;
    // A one-byte header is complete already: parse it now rather than return having consumed
    // nothing (a call that consumes nothing is a boundary's).
    if (head_.size() >= header_need_) return n + ScanSafetensorsHeader(data.subspan(n));
  } else {
    format_ = Mode::kDone;
    head_.clear();
  }
  return n;
}

size_t LayoutScanner::ScanZip(Bytes data) {
  const size_t n = zip_.Scan(data);
  if (in_pickle_) {
    // data.pkl's bytes (and, until its end is known, up to kMaxCutLag bytes after them).
    if (pickle_.size() + n <= kMaxPickleBytes + kMaxBoundaryLag) {
      pickle_.append(reinterpret_cast<const char*>(data.data()), n);
    } else {
      in_pickle_ = false;
      pickle_.clear();
      pickle_.shrink_to_fit();
    }
  }
  if (zip_.AtCut()) OnZipCut(zip_.cut());
  if (zip_.done()) format_ = Mode::kDone;
  return n;
}

size_t LayoutScanner::ScanSafetensorsHeader(Bytes data) {
  const size_t n = std::min(data.size(), header_need_ - head_.size());
  head_.append(AsChars(data.first(n)));
  if (head_.size() < header_need_) return n;
  auto index = ParseSafetensorsHeader(AsBytes(head_));
  head_.clear();
  head_.shrink_to_fit();
  if (!index.ok()) {
    format_ = Mode::kDone;  // not safetensors after all: opaque bytes
    return n;
  }
  std::vector<SignatureEntry> entries;
  for (const SafetensorsTensor& t : index->tensors) {
    if (t.end > t.begin) {
      tensors_.push_back(Tensor{t.name, t.begin, t.end, t.dtype});
      entries.emplace_back(std::string(SectionKey(t.name)), t.end - t.begin, t.dtype);
    }
  }
  signature_ = SignatureOf(std::move(entries));
  layout_.format = ContentLayout::Format::kSafetensors;
  format_ = tensors_.empty() ? Mode::kDone : Mode::kSafetensors;
  return n;
}

// Boundaries at every tensor's begin and end, known in advance: stop exactly there.
size_t LayoutScanner::ScanSafetensors(Bytes data) {
  const Tensor& next = tensors_[next_tensor_];
  const uint64_t at = open_ ? next.end : next.begin;
  if (offset_ < at) return static_cast<size_t>(std::min<uint64_t>(data.size(), at - offset_));
  // offset_ == at: a boundary (an end, and maybe the next tensor's begin).
  at_boundary_ = true;
  boundary_ = at;
  if (open_) {
    EndSection(at);
    ++next_tensor_;
  }
  if (next_tensor_ == tensors_.size()) {
    format_ = Mode::kDone;
    return 0;
  }
  const Tensor& t = tensors_[next_tensor_];
  if (t.begin == at) OpenSection(t.name, t.begin, t.dtype);
  return 0;
}

void LayoutScanner::OnZipCut(uint64_t cut) {
  at_boundary_ = true;
  boundary_ = cut;
  if (!zip_.cut_is_start()) {
    EndSection(cut);
    return;
  }
  if (open_) EndSection(layout_.sections.back().start);  // an empty entry has no end cut
  auto it = storage_dtypes_.find(zip_.entry_name());
  layout_.format = ContentLayout::Format::kTorchZip;
  OpenSection(zip_.entry_name(), cut,
              it != storage_dtypes_.end() ? std::optional<DType>(it->second) : std::nullopt);
  if (EndsWith(zip_.entry_name(), kPickleSuffix)) {
    in_pickle_ = true;  // Scan stops where a data start becomes known: nothing is past it
    pickle_.clear();
  }
}

void LayoutScanner::OpenSection(std::string name, uint64_t start, std::optional<DType> dtype) {
  LayoutSection s;
  s.name = std::move(name);
  s.start = start;
  s.dtype = dtype;
  layout_.sections.push_back(std::move(s));
  open_ = true;
}

void LayoutScanner::EndSection(uint64_t end) {
  open_ = false;
  LayoutSection& s = layout_.sections.back();
  s.size = end - s.start;
  if (in_pickle_) {
    in_pickle_ = false;
    if (pickle_.size() >= s.size) {
      pickle_.resize(static_cast<size_t>(s.size));
      const std::string prefix = s.name.substr(0, s.name.size() - kPickleSuffix.size());
      auto index = ParseTorchPickle(AsBytes(pickle_));
      if (index.ok()) {
        std::vector<SignatureEntry> entries;
        for (const TorchStorage& st : index->storages) {
          storage_dtypes_[prefix + "data/" + st.key] = st.dtype;
          const uint64_t bytes = st.nbytes;
          if (bytes > 0) entries.emplace_back("data/" + st.key, bytes, st.dtype);
        }
        signature_ = SignatureOf(std::move(entries));
      }
    }
    pickle_.clear();
    pickle_.shrink_to_fit();
  }
}

ContentLayout LayoutScanner::TakeLayout() {
  // A safetensors file that ends where its last tensor does: that end is known.
  if (open_ && format_ == Mode::kSafetensors && offset_ == tensors_[next_tensor_].end) {
    EndSection(offset_);
  }
  if (open_) {
    layout_.sections.pop_back();
    open_ = false;
  }
  return std::move(layout_);
}

}  // namespace ckptfs
