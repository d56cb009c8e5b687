#include "engine/views/precision_view.h"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "engine/format/pickle_ops.h"
#include "engine/format/safetensors.h"
#include "engine/format/torch_pickle.h"
#include "engine/format/zip.h"
#include "engine/util/coding.h"
#include "engine/util/mutex.h"
#include "engine/util/read_at.h"
#include "engine/views/convert.h"
#include "engine/views/tensor_view.h"

namespace ckptfs {
namespace {

using enum pickle::Op;

constexpr uint64_t kMaxPickleBytes = 64u << 20;
constexpr size_t kCrcBlockBytes = 4u << 20;

Result<std::string> ReadAt(const SourceReader& read, uint64_t offset, uint64_t n) {
  return ReadExact(read, offset, n, "precision view");
}

// ---- The storage type globals ---------------------------------------------------------------

struct StorageClass {
  std::string_view name;
  DType dtype;
};
constexpr StorageClass kFloatStorages[] = {{"DoubleStorage", DType::kF64},
                                           {"FloatStorage", DType::kF32},
                                           {"HalfStorage", DType::kF16},
                                           {"BFloat16Storage", DType::kBF16}};

std::optional<DType> FloatStorageDType(std::string_view name) {
  for (const auto& c : kFloatStorages) {
    if (c.name == name) return c.dtype;
  }
  return std::nullopt;
}
std::string_view FloatStorageName(DType t) {
  for (const auto& c : kFloatStorages) {
    if (c.dtype == t) return c.name;
  }
  return "";
}

// ---- The original archive's directory -------------------------------------------------------

struct ZipEntry {
  ZipDirEntry dir;
  uint64_t data = 0;  // where its bytes start
};

// The entries of the archive, each with where its data starts: from the layout when the
// cutter saw the entry there, else from its local header.
Result<std::vector<ZipEntry>> ReadDirectory(const SourceReader& read, uint64_t size,
                                            const ContentLayout& layout) {
  CKPTFS_ASSIGN_OR_RETURN(std::vector<ZipDirEntry> dir, ReadZipDirectory(read, size));
  std::vector<ZipEntry> entries;
  entries.reserve(dir.size());
  for (ZipDirEntry& d : dir) {
    ZipEntry e{std::move(d), 0};
    const LayoutSection* s = layout.Find(e.dir.name);
    if (s != nullptr && s->size == e.dir.size) {
      e.data = s->start;
    } else {
      CKPTFS_ASSIGN_OR_RETURN(e.data, ReadZipDataOffset(read, e.dir.local_offset));
    }
    if (e.data > size || e.dir.size > size - e.data) {
      return Status::Corruption("zip: entry past the end");
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

// ---- The new archive ------------------------------------------------------------------------

struct OutEntry {
  std::string name;
  enum class Kind { kCopy, kConvert, kBytes } kind = Kind::kCopy;
  uint64_t source = 0;  // kCopy, kConvert
  uint64_t size = 0;    // bytes in the new archive
  uint64_t numel = 0;   // kConvert
  DType from = DType::kU8, to = DType::kU8;
  std::shared_ptr<const std::string> bytes;  // kBytes
  uint32_t crc = 0;
  bool crc_known = false;
};

void AddData(VirtualFile& f, const OutEntry& e) {
  switch (e.kind) {
    case OutEntry::Kind::kCopy:
      f.AddCopy(e.source, e.size);
      break;
    case OutEntry::Kind::kConvert:
      f.AddConvert(e.source, e.numel, e.from, e.to);
      break;
    case OutEntry::Kind::kBytes:
      f.AddBytes(*e.bytes);
      break;
  }
}

// Builds the archive (with whatever CRCs the entries hold).
std::shared_ptr<VirtualFile> BuildZip(const std::vector<OutEntry>& entries) {
  auto f = std::make_shared<VirtualFile>();
  ZipWriter zip;
  for (const OutEntry& e : entries) {
    f->AddBytes(zip.LocalHeader(e.name, e.size, e.crc, f->size()));
    AddData(*f, e);
  }
  f->AddBytes(zip.Finish(f->size()));
  return f;
}

class TorchPlan : public PrecisionPlan {
 public:
  explicit TorchPlan(std::vector<OutEntry> entries)
      : entries_(std::move(entries)), size_(BuildZip(entries_)->size()) {}
  uint64_t size() const override { return size_; }
  uint64_t memory_bytes() const override {
    MutexLock lock(mu_);
    uint64_t n = sizeof(*this) + (file_ ? file_->memory_bytes() : 0);
    for (const OutEntry& e : entries_) {
      n += sizeof(OutEntry) + e.name.capacity() + (e.bytes ? e.bytes->capacity() : 0);
    }
    return n;
  }

  Result<std::shared_ptr<const VirtualFile>> Finish(const SourceReader& read) override {
    MutexLock lock(mu_);
    if (file_) return file_;
    Buffer block(kCrcBlockBytes);
    for (OutEntry& e : entries_) {
      if (e.crc_known) continue;
      VirtualFile data;
      AddData(data, e);
      uLong crc = crc32(0L, Z_NULL, 0);
      for (uint64_t off = 0; off < data.size();) {
        CKPTFS_ASSIGN_OR_RETURN(size_t n, data.Read(off, block.mutable_bytes(), read));
        if (n == 0) return Status::Corruption("precision view: short read");
        crc = crc32_z(crc, reinterpret_cast<const Bytef*>(block.data()), n);
        off += n;
      }
      e.crc = static_cast<uint32_t>(crc);
      e.crc_known = true;
    }
    file_ = BuildZip(entries_);
    return file_;
  }

 private:
  mutable Mutex mu_;
  std::vector<OutEntry> entries_ GUARDED_BY(mu_);
  const uint64_t size_;
  std::shared_ptr<const VirtualFile> file_ GUARDED_BY(mu_);
};

Result<std::shared_ptr<PrecisionPlan>> PlanTorch(const SourceReader& read, uint64_t size,
                                                 const ContentLayout& layout, DType to) {
  std::string prefix;
  CKPTFS_ASSIGN_OR_RETURN(std::string pkl, ReadTorchPickle(read, layout, &prefix));
  auto index = ParseTorchPickle(AsBytes(pkl));
  if (!index.ok()) return Status::NotSupported("data.pkl: " + index.status().message());
  auto dir = ReadDirectory(read, size, layout);
  if (!dir.ok()) return Status::NotSupported(dir.status().message());
  std::unordered_map<std::string, const TorchStorage*> storages;
  for (const TorchStorage& s : index->storages) storages.emplace(prefix + "data/" + s.key, &s);
  std::vector<OutEntry> out;
  size_t converted = 0, pkl_entries = 0;
  std::unordered_map<std::string, bool> seen;
  for (const ZipEntry& z : *dir) {
    OutEntry e;
    e.name = z.dir.name;
    e.source = z.data;
    e.size = z.dir.size;
    e.crc = z.dir.crc;
    e.crc_known = true;
    auto st = storages.find(z.dir.name);
    if (z.dir.name == prefix + "data.pkl") {
      ++pkl_entries;
      e.kind = OutEntry::Kind::kBytes;
      auto rewritten = RewriteTorchPickle(pkl, to, [&](DType d) { return ConvertsTo(d, to); });
      if (!rewritten.ok()) return Status::NotSupported(rewritten.status().message());
      e.bytes = std::make_shared<const std::string>(std::move(*rewritten));
      e.size = e.bytes->size();
      e.crc = static_cast<uint32_t>(crc32_z(
          crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(e.bytes->data()), e.bytes->size()));
    } else if (st != storages.end() && ConvertsTo(st->second->dtype, to)) {
      if (z.dir.size != st->second->nbytes) return Status::NotSupported("storage size mismatch");
      e.kind = OutEntry::Kind::kConvert;
      e.numel = st->second->numel;
      e.from = st->second->dtype;
      e.to = to;
      e.size = e.numel * ElementSize(to);
      e.crc_known = false;
      ++converted;
    }
    if (seen[z.dir.name]) return Status::NotSupported("zip: duplicate entry names");
    seen[z.dir.name] = true;
    out.push_back(std::move(e));
  }
  // Every storage the pickle now names with the new type must have been converted.
  for (const TorchStorage& s : index->storages) {
    if (ConvertsTo(s.dtype, to) && !seen[prefix + "data/" + s.key]) {
      return Status::NotSupported("a floating storage has no record");
    }
  }
  if (pkl_entries != 1) return Status::NotSupported("zip: no single data.pkl");
  if (converted == 0) return Status::NotSupported("nothing to convert");
  return std::shared_ptr<PrecisionPlan>(std::make_shared<TorchPlan>(std::move(out)));
}

// ---- Safetensors ------------------------------------------------------------------------------

class FixedPlan : public PrecisionPlan {
 public:
  explicit FixedPlan(std::shared_ptr<const VirtualFile> file) : file_(std::move(file)) {}
  uint64_t size() const override { return file_->size(); }
  Result<std::shared_ptr<const VirtualFile>> Finish(const SourceReader&) override { return file_; }
  uint64_t memory_bytes() const override { return sizeof(*this) + file_->memory_bytes(); }

 private:
  const std::shared_ptr<const VirtualFile> file_;
};

Result<std::shared_ptr<PrecisionPlan>> PlanSafetensors(const SourceReader& read, uint64_t size,
                                                       DType to) {
  if (size < 8) return Status::NotSupported("not safetensors");
  CKPTFS_ASSIGN_OR_RETURN(std::string head, ReadAt(read, 0, 8));
  auto need = SafetensorsHeaderBytes(AsBytes(head));
  if (!need.ok() || *need > size || *need > kMaxPickleBytes + 8) {
    return Status::NotSupported("not safetensors");
  }
  CKPTFS_ASSIGN_OR_RETURN(head, ReadAt(read, 0, *need));
  auto index = ParseSafetensorsHeader(AsBytes(head));
  if (!index.ok() || index->data_end > size) return Status::NotSupported("not safetensors");
  // The header as one JSON object, metadata first, then the tensors in the order of their
  // data; written member by member (the names are unique: the parser refuses a name twice),
  // since an ordered_json object looks each new key up among all before it, quadratic in the
  // number of tensors. The same bytes as dumping that object.
  auto dump = [](const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string json = "{";
  if (!index->metadata.empty()) {
    json += "\"__metadata__\":" + dump(nlohmann::ordered_json(index->metadata));
  }
  auto file = std::make_shared<VirtualFile>();
  std::vector<std::pair<const SafetensorsTensor*, DType>> order;
  uint64_t off = 0;
  size_t converted = 0;
  for (const SafetensorsTensor& t : index->tensors) {
    const DType out = ConvertsTo(t.dtype, to) ? to : t.dtype;
    converted += out != t.dtype;
    const uint64_t bytes = (t.end - t.begin) / ElementSize(t.dtype) * ElementSize(out);
    if (json.size() > 1) json += ',';
    json += dump(nlohmann::ordered_json(t.name));
    json += ':';
    json += dump({{"dtype", std::string(SafetensorsName(out))},
                  {"shape", t.shape},
                  {"data_offsets", {off, off + bytes}}});
    off += bytes;
    order.emplace_back(&t, out);
  }
  if (converted == 0) return Status::NotSupported("nothing to convert");
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  PutLE<uint64_t>(prefix.data(), json.size());
  prefix += json;
  file->AddBytes(std::move(prefix));
  for (const auto& [t, out] : order) {
    file->AddConvert(t->begin, (t->end - t->begin) / ElementSize(t->dtype), t->dtype, out);
  }
  return std::shared_ptr<PrecisionPlan>(std::make_shared<FixedPlan>(std::move(file)));
}

// ---- The pickle rewriter ----------------------------------------------------------------------

bool IsStringPush(uint8_t op) {
  return op == pickle::kBinUnicode || op == pickle::kShortBinUnicode || op == pickle::kBinUnicode8;
}

}  // namespace

Result<std::string> RewriteTorchPickle(std::string_view pkl, DType to,
                                       const std::function<bool(DType)>& converted) {
  const std::string new_name(FloatStorageName(to));
  auto replacement = [&](std::string_view module,
                         std::string_view name) -> std::optional<std::string> {
    if (module != "torch") return std::nullopt;
    std::optional<DType> d = FloatStorageDType(name);
    if (!d || !converted(*d)) return std::nullopt;
    return new_name;
  };
  std::string out;
  out.reserve(pkl.size() + 64);
  // The strings pushed since the last other opcode (for STACK_GLOBAL): where their opcode
  // starts in `out` (npos: from the memo), and their value.
  struct Pushed {
    size_t at;
    std::string value;
  };
  std::vector<Pushed> pushed;
  std::unordered_map<uint64_t, std::string> memo_strings;
  uint64_t memo_size = 0;
  size_t p = 0;
  bool stopped = false;
  while (p < pkl.size() && !stopped) {
    const uint8_t op = static_cast<uint8_t>(pkl[p]);
    CKPTFS_ASSIGN_OR_RETURN(const size_t len, PickleOpLength(pkl, p));
    const std::string_view whole = pkl.substr(p, len);
    p += len;
    if (op == kFrame) continue;  // FRAME: lengths would change; framing is optional
    const bool is_put = op == kBinPut || op == kLongBinPut || op == kMemoize || op == kPut;
    if (op == kGlobal) {  // GLOBAL module\nname\n
      const size_t nl = whole.find('\n', 1);
      const std::string_view module = whole.substr(1, nl - 1);
      const std::string_view name = whole.substr(nl + 1, whole.size() - nl - 2);
      if (auto r = replacement(module, name)) {
        out += static_cast<char>(kGlobal);
        out += module;
        out += '\n';
        out += *r;
        out += '\n';
        pushed.clear();
        continue;
      }
    } else if (op == kStackGlobal) {  // STACK_GLOBAL: the two strings just pushed
      if (pushed.size() >= 2) {
        const Pushed& name = pushed[pushed.size() - 1];
        const Pushed& module = pushed[pushed.size() - 2];
        std::optional<DType> d = FloatStorageDType(name.value);
        if (module.value == "torch" && d && converted(*d)) {
          if (name.at == std::string::npos) {
            return Status::Corruption("pickle: a storage type name from the memo");
          }
          // Replace the name's opcode (and whatever memo puts follow it) in `out`.
          std::string tailing = out.substr(name.at);
          const size_t op_len =
              tailing[0] == static_cast<char>(kShortBinUnicode) ? 2 + name.value.size()
              : tailing[0] == static_cast<char>(kBinUnicode)    ? 5 + name.value.size()
                                                                : 9 + name.value.size();
          std::string rewritten;
          rewritten += static_cast<char>(kShortBinUnicode);
          rewritten += static_cast<char>(new_name.size());
          rewritten += new_name;
          out.resize(name.at);
          out += rewritten;
          out += tailing.substr(op_len);
          for (auto& [key, value] : memo_strings) {  // its memo entries now hold the new name
            if (value == name.value) value = new_name;
          }
        }
      }
      pushed.clear();
    } else if (IsStringPush(op)) {
      const size_t skip = op == kShortBinUnicode ? 2 : op == kBinUnicode ? 5 : 9;
      pushed.push_back({out.size(), std::string(whole.substr(skip))});
    } else if (op == kBinGet || op == kLongBinGet) {  // BINGET: a memoized string, perhaps
      const uint64_t key = op == kBinGet ? uint64_t{static_cast<uint8_t>(whole[1])}
                                         : GetLE<uint32_t>(whole.data() + 1);
      auto it = memo_strings.find(key);
      pushed.push_back({std::string::npos, it == memo_strings.end() ? "" : it->second});
    } else if (is_put) {
      uint64_t key;
      if (op == kMemoize) {
        key = memo_size;
      } else if (op == kPut) {
        const std::string_view digits = whole.substr(1, whole.size() - 2);
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), key);
        if (ec != std::errc() || end != digits.data() + digits.size()) {
          return Status::Corruption("pickle: bad PUT index");
        }
      } else {
        key = op == kBinPut ? uint64_t{static_cast<uint8_t>(whole[1])}
                            : GetLE<uint32_t>(whole.data() + 1);
      }
      if (!memo_strings.count(key)) ++memo_size;
      if (!pushed.empty()) {
        memo_strings[key] = pushed.back().value;
      } else {
        memo_strings.erase(key);
      }
    } else {
      pushed.clear();
    }
    if (op == kStop) stopped = true;
    out += whole;
  }
  if (!stopped) return Status::Corruption("pickle: no STOP");
  // What follows STOP is kept as it was.
  out += pkl.substr(p);
  return out;
}

Result<std::shared_ptr<PrecisionPlan>> PlanPrecisionView(const SourceReader& read, uint64_t size,
                                                         const std::optional<ContentLayout>& layout,
                                                         DType to) {
  if (layout && layout->format == ContentLayout::Format::kTorchZip) {
    return PlanTorch(read, size, *layout, to);
  }
  if (!layout || layout->format != ContentLayout::Format::kTorchZip) {
    return PlanSafetensors(read, size, to);
  }
  return Status::NotSupported("no tensor layout");
}

}  // namespace ckptfs
