#include "engine/views/precision_view.h"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "engine/format/safetensors.h"
#include "engine/format/torch_pickle.h"
#include "engine/views/convert.h"
#include "engine/views/tensor_view.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMaxDirectoryBytes = 64u << 20;
constexpr uint64_t kMaxPickleBytes = 64u << 20;
constexpr size_t kCrcBlockBytes = 4u << 20;
constexpr uint32_t kU32Max = 0xFFFFFFFFu;

// ---- Little-endian helpers ------------------------------------------------------------------

uint64_t Le(std::string_view s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}
void Put(std::string& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

Result<std::string> ReadAt(const SourceReader& read, uint64_t offset, uint64_t n) {
  std::string out(static_cast<size_t>(n), '\0');
  CKPTFS_ASSIGN_OR_RETURN(size_t got,
                          read(offset, {reinterpret_cast<std::byte*>(out.data()), out.size()}));
  if (got != n) return Status::Corruption("zip: truncated");
  return out;
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
  std::string name;
  uint32_t crc = 0;
  uint64_t size = 0;          // stored == uncompressed
  uint64_t local_offset = 0;  // of its local header
  uint64_t data = 0;          // where its bytes start
};

Result<std::vector<ZipEntry>> ReadDirectory(const SourceReader& read, uint64_t size,
                                            const ContentLayout& layout) {
  const uint64_t tail_len = std::min<uint64_t>(size, 65535 + 22);
  CKPTFS_ASSIGN_OR_RETURN(std::string tail, ReadAt(read, size - tail_len, tail_len));
  size_t eocd = std::string::npos;
  for (size_t i = tail.size() >= 22 ? tail.size() - 22 + 1 : 0; i-- > 0;) {
    if (Le(tail, i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) return Status::Corruption("zip: no end of central directory");
  uint64_t count = Le(tail, eocd + 10, 2), cd_size = Le(tail, eocd + 12, 4),
           cd_offset = Le(tail, eocd + 16, 4);
  const uint64_t eocd_abs = size - tail_len + eocd;
  if (count == 0xFFFF || cd_size == kU32Max || cd_offset == kU32Max) {
    if (eocd_abs < 20) return Status::Corruption("zip: no zip64 locator");
    CKPTFS_ASSIGN_OR_RETURN(std::string loc, ReadAt(read, eocd_abs - 20, 20));
    if (Le(loc, 0, 4) != 0x07064b50) return Status::Corruption("zip: no zip64 locator");
    const uint64_t at = Le(loc, 8, 8);
    if (at + 56 > size) return Status::Corruption("zip: bad zip64 record offset");
    CKPTFS_ASSIGN_OR_RETURN(std::string z, ReadAt(read, at, 56));
    if (Le(z, 0, 4) != 0x06064b50) return Status::Corruption("zip: bad zip64 record");
    count = Le(z, 32, 8);
    cd_size = Le(z, 40, 8);
    cd_offset = Le(z, 48, 8);
  }
  if (cd_size > kMaxDirectoryBytes || cd_offset + cd_size > size || count > cd_size / 46) {
    return Status::Corruption("zip: bad central directory");
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string cd, ReadAt(read, cd_offset, cd_size));
  std::vector<ZipEntry> entries;
  size_t p = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + 46 > cd.size() || Le(cd, p, 4) != 0x02014b50) {
      return Status::Corruption("zip: bad central directory entry");
    }
    const uint64_t flags = Le(cd, p + 8, 2), method = Le(cd, p + 10, 2);
    ZipEntry e;
    e.crc = static_cast<uint32_t>(Le(cd, p + 16, 4));
    uint64_t comp = Le(cd, p + 20, 4), uncomp = Le(cd, p + 24, 4);
    const size_t nlen = Le(cd, p + 28, 2), xlen = Le(cd, p + 30, 2), clen = Le(cd, p + 32, 2);
    e.local_offset = Le(cd, p + 42, 4);
    if (p + 46 + nlen + xlen + clen > cd.size()) return Status::Corruption("zip: entry overflows");
    e.name = cd.substr(p + 46, nlen);
    // The zip64 extra field holds the fields that are 0xFFFFFFFF, in this order.
    for (size_t x = p + 46 + nlen; x + 4 <= p + 46 + nlen + xlen;) {
      const uint64_t id = Le(cd, x, 2), len = Le(cd, x + 2, 2);
      if (x + 4 + len > p + 46 + nlen + xlen) break;
      if (id == 1) {
        size_t f = x + 4;
        for (uint64_t* v : {&uncomp, &comp, &e.local_offset}) {
          if (*v == kU32Max && f + 8 <= x + 4 + len) {
            *v = Le(cd, f, 8);
            f += 8;
          }
        }
      }
      x += 4 + len;
    }
    if (method != 0 || (flags & 1) || comp != uncomp) {
      return Status::NotSupported("zip: compressed or encrypted entry");
    }
    e.size = uncomp;
    const LayoutSection* s = layout.Find(e.name);
    if (s != nullptr && s->size == e.size) {
      e.data = s->start;
    } else {
      CKPTFS_ASSIGN_OR_RETURN(std::string lh, ReadAt(read, e.local_offset, 30));
      if (Le(lh, 0, 4) != 0x04034b50) return Status::Corruption("zip: bad local header");
      e.data = e.local_offset + 30 + Le(lh, 26, 2) + Le(lh, 28, 2);
    }
    if (e.data + e.size > size) return Status::Corruption("zip: entry past the end");
    entries.push_back(std::move(e));
    p += 46 + nlen + xlen + clen;
  }
  std::sort(entries.begin(), entries.end(),
            [](const ZipEntry& a, const ZipEntry& b) { return a.local_offset < b.local_offset; });
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
  std::string cd;
  bool any64 = false;
  for (const OutEntry& e : entries) {
    const uint64_t offset = f->size();
    const bool big = e.size >= kU32Max;
    std::string extra;
    if (big) {
      Put(extra, 1, 2);
      Put(extra, 16, 2);
      Put(extra, e.size, 8);
      Put(extra, e.size, 8);
    }
    // Data aligned to 64 bytes, as torch writes it (a padding extra field, id "FB").
    const uint64_t base = offset + 30 + e.name.size() + extra.size() + 4;
    const uint64_t pad = (64 - base % 64) % 64;
    Put(extra, 0x4246, 2);
    Put(extra, pad, 2);
    extra.append(static_cast<size_t>(pad), 'Z');
    std::string lh;
    Put(lh, 0x04034b50, 4);
    Put(lh, big ? 45 : 20, 2);
    Put(lh, 0, 2);  // flags: sizes and CRC are in this header
    Put(lh, 0, 2);  // stored
    Put(lh, 0, 4);  // time, date
    Put(lh, e.crc, 4);
    Put(lh, big ? kU32Max : e.size, 4);
    Put(lh, big ? kU32Max : e.size, 4);
    Put(lh, e.name.size(), 2);
    Put(lh, extra.size(), 2);
    lh += e.name;
    lh += extra;
    f->AddBytes(std::move(lh));
    AddData(*f, e);
    // Its central directory entry.
    const bool far = offset >= kU32Max;
    std::string x64;
    if (big || far) {
      Put(x64, 1, 2);
      Put(x64, (big ? 16 : 0) + (far ? 8 : 0), 2);
      if (big) {
        Put(x64, e.size, 8);
        Put(x64, e.size, 8);
      }
      if (far) Put(x64, offset, 8);
      any64 = true;
    }
    Put(cd, 0x02014b50, 4);
    Put(cd, 45, 2);  // made by
    Put(cd, (big || far) ? 45 : 20, 2);
    Put(cd, 0, 2);
    Put(cd, 0, 2);
    Put(cd, 0, 4);
    Put(cd, e.crc, 4);
    Put(cd, big ? kU32Max : e.size, 4);
    Put(cd, big ? kU32Max : e.size, 4);
    Put(cd, e.name.size(), 2);
    Put(cd, x64.size(), 2);
    Put(cd, 0, 2);  // comment
    Put(cd, 0, 2);  // disk
    Put(cd, 0, 2);  // internal attributes
    Put(cd, 0, 4);  // external attributes
    Put(cd, far ? kU32Max : offset, 4);
    cd += e.name;
    cd += x64;
  }
  const uint64_t cd_offset = f->size(), cd_size = cd.size(), n = entries.size();
  const bool zip64 = any64 || cd_offset >= kU32Max || n >= 0xFFFF;
  if (zip64) {
    const uint64_t at = cd_offset + cd_size;
    Put(cd, 0x06064b50, 4);
    Put(cd, 44, 8);
    Put(cd, 45, 2);
    Put(cd, 45, 2);
    Put(cd, 0, 4);
    Put(cd, 0, 4);
    Put(cd, n, 8);
    Put(cd, n, 8);
    Put(cd, cd_size, 8);
    Put(cd, cd_offset, 8);
    Put(cd, 0x07064b50, 4);
    Put(cd, 0, 4);
    Put(cd, at, 8);
    Put(cd, 1, 4);
  }
  Put(cd, 0x06054b50, 4);
  Put(cd, 0, 2);
  Put(cd, 0, 2);
  Put(cd, zip64 ? 0xFFFF : n, 2);
  Put(cd, zip64 ? 0xFFFF : n, 2);
  Put(cd, zip64 ? kU32Max : cd_size, 4);
  Put(cd, zip64 ? kU32Max : cd_offset, 4);
  Put(cd, 0, 2);
  f->AddBytes(std::move(cd));
  return f;
}

class TorchPlan : public PrecisionPlan {
 public:
  explicit TorchPlan(std::vector<OutEntry> entries)
      : entries_(std::move(entries)), size_(BuildZip(entries_)->size()) {}
  uint64_t size() const override { return size_; }
  uint64_t memory_bytes() const override {
    std::lock_guard lock(mu_);
    uint64_t n = sizeof(*this) + (file_ ? file_->memory_bytes() : 0);
    for (const OutEntry& e : entries_) {
      n += sizeof(OutEntry) + e.name.capacity() + (e.bytes ? e.bytes->capacity() : 0);
    }
    return n;
  }

  Result<std::shared_ptr<const VirtualFile>> Finish(const SourceReader& read) override {
    std::lock_guard lock(mu_);
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
  mutable std::mutex mu_;
  std::vector<OutEntry> entries_;  // GUARDED_BY(mu_)
  const uint64_t size_;
  std::shared_ptr<const VirtualFile> file_;  // GUARDED_BY(mu_)
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
    e.name = z.name;
    e.source = z.data;
    e.size = z.size;
    e.crc = z.crc;
    e.crc_known = true;
    auto st = storages.find(z.name);
    if (z.name == prefix + "data.pkl") {
      ++pkl_entries;
      e.kind = OutEntry::Kind::kBytes;
      auto rewritten = RewriteTorchPickle(pkl, to, [&](DType d) { return ConvertsTo(d, to); });
      if (!rewritten.ok()) return Status::NotSupported(rewritten.status().message());
      e.bytes = std::make_shared<const std::string>(std::move(*rewritten));
      e.size = e.bytes->size();
      e.crc = static_cast<uint32_t>(crc32_z(
          crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(e.bytes->data()), e.bytes->size()));
    } else if (st != storages.end() && ConvertsTo(st->second->dtype, to)) {
      if (z.size != st->second->nbytes) return Status::NotSupported("storage size mismatch");
      e.kind = OutEntry::Kind::kConvert;
      e.numel = st->second->numel;
      e.from = st->second->dtype;
      e.to = to;
      e.size = e.numel * ElementSize(to);
      e.crc_known = false;
      ++converted;
    }
    if (seen[z.name]) return Status::NotSupported("zip: duplicate entry names");
    seen[z.name] = true;
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
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!index->metadata.empty()) header["__metadata__"] = index->metadata;
  auto file = std::make_shared<VirtualFile>();
  std::vector<std::pair<const SafetensorsTensor*, DType>> order;
  uint64_t off = 0;
  size_t converted = 0;
  for (const SafetensorsTensor& t : index->tensors) {
    const DType out = ConvertsTo(t.dtype, to) ? to : t.dtype;
    converted += out != t.dtype;
    const uint64_t bytes = (t.end - t.begin) / ElementSize(t.dtype) * ElementSize(out);
    header[t.name] = {{"dtype", std::string(SafetensorsName(out))},
                      {"shape", t.shape},
                      {"data_offsets", {off, off + bytes}}};
    off += bytes;
    order.emplace_back(&t, out);
  }
  if (converted == 0) return Status::NotSupported("nothing to convert");
  std::string json = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string prefix;
  Put(prefix, json.size(), 8);
  prefix += json;
  file->AddBytes(std::move(prefix));
  for (const auto& [t, out] : order) {
    file->AddConvert(t->begin, (t->end - t->begin) / ElementSize(t->dtype), t->dtype, out);
  }
  return std::shared_ptr<PrecisionPlan>(std::make_shared<FixedPlan>(std::move(file)));
}

// ---- The pickle rewriter ----------------------------------------------------------------------

// Argument bytes of an opcode: fixed, counted (a little-endian length of n bytes), or lines.
struct OpArg {
  enum Kind : uint8_t { kNone, kFixed, kCounted, kLines, kUnknown } kind = kUnknown;
  uint8_t n = 0;
};

OpArg ArgOf(uint8_t op) {
  switch (op) {
    case '(':
    case '.':
    case '0':
    case '1':
    case '2':
    case 'N':
    case 0x88:
    case 0x89:
    case ']':
    case 'a':
    case 'e':
    case 'l':
    case ')':
    case 't':
    case 0x85:
    case 0x86:
    case 0x87:
    case '}':
    case 'd':
    case 's':
    case 'u':
    case 'b':
    case 'R':
    case 0x81:
    case 'Q':
    case 0x94:
    case 0x8f:
    case 0x90:
    case 0x91:
    case 0x92:
    case 0x93:
    case 0x97:
    case 0x98:
    case 'o':
      return {OpArg::kNone, 0};
    case 'K':
    case 'h':
    case 'q':
    case 0x80:
    case 0x82:
      return {OpArg::kFixed, 1};
    case 'M':
    case 0x83:
      return {OpArg::kFixed, 2};
    case 'J':
    case 'j':
    case 'r':
    case 0x84:
      return {OpArg::kFixed, 4};
    case 'G':
    case 0x95:
      return {OpArg::kFixed, 8};
    case 0x8a:
    case 'U':
    case 0x8c:
    case 'C':
      return {OpArg::kCounted, 1};
    case 0x8b:
    case 'T':
    case 'X':
    case 'B':
      return {OpArg::kCounted, 4};
    case 0x8d:
    case 0x8e:
    case 0x96:
      return {OpArg::kCounted, 8};
    case 'I':
    case 'L':
    case 'S':
    case 'V':
    case 'F':
    case 'g':
    case 'p':
    case 'P':
      return {OpArg::kLines, 1};
    case 'c':
    case 'i':
      return {OpArg::kLines, 2};
    default:
      return {};
  }
}

bool IsStringPush(uint8_t op) { return op == 'X' || op == 0x8c || op == 0x8d; }

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
    const OpArg arg = ArgOf(op);
    size_t len = 1;
    switch (arg.kind) {
      case OpArg::kUnknown:
        return Status::Corruption("pickle: unknown opcode");
      case OpArg::kNone:
        break;
      case OpArg::kFixed:
        len += arg.n;
        break;
      case OpArg::kCounted: {
        if (p + 1 + arg.n > pkl.size()) return Status::Corruption("pickle: truncated");
        const uint64_t n = Le(pkl, p + 1, arg.n);
        if (n > pkl.size()) return Status::Corruption("pickle: truncated");
        len += arg.n + static_cast<size_t>(n);
        break;
      }
      case OpArg::kLines: {
        size_t q = p + 1;
        for (int i = 0; i < arg.n; ++i) {
          q = pkl.find('\n', q);
          if (q == std::string_view::npos) return Status::Corruption("pickle: truncated");
          ++q;
        }
        len = q - p;
        break;
      }
    }
    if (p + len > pkl.size()) return Status::Corruption("pickle: truncated");
    const std::string_view whole = pkl.substr(p, len);
    p += len;
    if (op == 0x95) continue;  // FRAME: lengths would change; framing is optional
    const bool is_put = op == 'q' || op == 'r' || op == 0x94 || op == 'p';
    if (op == 'c') {  // GLOBAL module\nname\n
      const size_t nl = whole.find('\n', 1);
      const std::string_view module = whole.substr(1, nl - 1);
      const std::string_view name = whole.substr(nl + 1, whole.size() - nl - 2);
      if (auto r = replacement(module, name)) {
        out += 'c';
        out += module;
        out += '\n';
        out += *r;
        out += '\n';
        pushed.clear();
        continue;
      }
    } else if (op == 0x93) {  // STACK_GLOBAL: the two strings just pushed
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
          const size_t op_len = tailing[0] == static_cast<char>(0x8c) ? 2 + name.value.size()
                                : tailing[0] == 'X'                   ? 5 + name.value.size()
                                                                      : 9 + name.value.size();
          std::string rewritten;
          rewritten += static_cast<char>(0x8c);
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
      const size_t skip = op == 0x8c ? 2 : op == 'X' ? 5 : 9;
      pushed.push_back({out.size(), std::string(whole.substr(skip))});
    } else if (op == 'h' || op == 'j') {  // BINGET: a memoized string, perhaps
      const uint64_t key = Le(whole, 1, op == 'h' ? 1 : 4);
      auto it = memo_strings.find(key);
      pushed.push_back({std::string::npos, it == memo_strings.end() ? "" : it->second});
    } else if (is_put) {
      uint64_t key;
      if (op == 0x94) {
        key = memo_size;
      } else if (op == 'p') {
        const std::string_view digits = whole.substr(1, whole.size() - 2);
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), key);
        if (ec != std::errc() || end != digits.data() + digits.size()) {
          return Status::Corruption("pickle: bad PUT index");
        }
      } else {
        key = Le(whole, 1, op == 'q' ? 1 : 4);
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
    if (op == '.') stopped = true;
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
