#include "engine/format/layout.h"

#include <cstring>

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

}  // namespace

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

bool LayoutScanner::done() const { return zip_done_; }

size_t LayoutScanner::Scan(Bytes data) {
  at_boundary_ = false;
  if (zip_done_) {
    offset_ += data.size();
    return data.size();
  }
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
  offset_ += n;
  if (zip_.AtCut()) OnZipCut(zip_.cut());
  if (zip_.done()) {
    zip_done_ = true;
    if (layout_.format == ContentLayout::Format::kNone && zip_.recognized() &&
        !layout_.sections.empty()) {
      layout_.format = ContentLayout::Format::kTorchZip;
    }
  }
  return n;
}

void LayoutScanner::OnZipCut(uint64_t cut) {
  at_boundary_ = true;
  boundary_ = cut;
  if (!zip_.cut_is_start()) {
    EndSection(cut);
    return;
  }
  if (open_) EndSection(layout_.sections.back().start);  // an empty entry has no end cut
  LayoutSection s;
  s.name = zip_.entry_name();
  s.start = cut;
  auto it = storage_dtypes_.find(s.name);
  if (it != storage_dtypes_.end()) s.dtype = it->second;
  layout_.format = ContentLayout::Format::kTorchZip;
  layout_.sections.push_back(std::move(s));
  open_ = true;
  if (EndsWith(zip_.entry_name(), kPickleSuffix)) {
    in_pickle_ = true;  // Scan stops where a data start becomes known: nothing is past it
    pickle_.clear();
  }
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
        for (const TorchStorage& st : index->storages) {
          storage_dtypes_[prefix + "data/" + st.key] = st.dtype;
        }
      }
    }
    pickle_.clear();
    pickle_.shrink_to_fit();
  }
}

ContentLayout LayoutScanner::TakeLayout() {
  if (open_) {
    layout_.sections.pop_back();
    open_ = false;
  }
  return std::move(layout_);
}

}  // namespace ckptfs
