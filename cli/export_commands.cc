// diff, export, restore (cli/export_commands.h).
#include "cli/export_commands.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cli/admin_client.h"
#include "cli/progress.h"
#include "cli/store_commands.h"
#include "engine/format/layout.h"
#include "engine/format/torch_pickle.h"
#include "engine/format/zip.h"
#include "engine/namespace/admin.h"
#include "engine/util/file.h"
#include "engine/views/tensor_view.h"

namespace ckptfs::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kCopyBlock = 4 << 20;

unsigned long long U(const json& v) { return v.is_number() ? v.get<unsigned long long>() : 0; }

// The bytes of a tensor's data (its .npy image without the .npy header).
uint64_t DataBytes(const TensorView::Entry& t) {
  uint64_t elements = 1;
  for (uint64_t d : t.shape) elements *= d;
  return elements * ElementSize(t.dtype);
}

// Writes `size` bytes from `read` into the new file `path`, a block at a time (each one added
// to `progress`, when given).
Status CopyOut(const SourceReader& read, uint64_t size, const fs::path& path, mode_t mode,
               ProgressLine* progress = nullptr) {
  FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (fd.get() < 0) return Status::FromErrno(errno, "create " + path.string());
  std::vector<std::byte> buf(kCopyBlock);
  for (uint64_t off = 0; off < size;) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    CKPTFS_ASSIGN_OR_RETURN(size_t n, read(off, MutableBytes(buf.data(), want)));
    if (n == 0) return Status::Corruption(path.string() + ": the source ended early");
    CKPTFS_RETURN_IF_ERROR(PWriteFull(fd.get(), off, Bytes(buf.data(), n), path));
    off += n;
    if (progress != nullptr) progress->Add(n);
  }
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync " + path.string());
  return Status::OK();
}

// The tensors of `view` as a torch.save file at the new `path`: our own zip writer (zip.h) and
// pickle writer (torch_pickle.h), the records named as torch names them (archive/data.pkl,
// archive/data/N, byteorder, version), each tensor's bytes streamed from the source in C
// order, its CRC-32 patched into its header once known. Returns the bytes written. The
// tensors' bytes are added to `progress` as they are written.
Result<uint64_t> WriteTorchFile(const TensorView& view, const SourceReader& read,
                                const fs::path& path, ProgressLine* progress) {
  std::vector<TorchTensorOut> tensors;
  for (const auto& t : view.tensors) {
    tensors.push_back({t.name, t.dtype, t.shape, std::to_string(tensors.size())});
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string pkl, WriteTorchStateDictPickle(tensors));
  FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::FromErrno(errno, "create " + path.string());
  const std::string archive = "archive/";
  ZipWriter zip;
  uint64_t at = 0;
  auto put = [&](std::string_view bytes) -> Status {
    CKPTFS_RETURN_IF_ERROR(PWriteFull(fd.get(), at, AsBytes(bytes), path));
    at += bytes.size();
    return Status::OK();
  };
  auto put_record = [&](const std::string& name, std::string_view bytes) -> Status {
    const auto crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
    CKPTFS_RETURN_IF_ERROR(put(zip.LocalHeader(archive + name, bytes.size(), crc, at)));
    return put(bytes);
  };
  CKPTFS_RETURN_IF_ERROR(put_record("data.pkl", pkl));
  CKPTFS_RETURN_IF_ERROR(put_record("byteorder", "little"));
  std::vector<std::byte> buf(kCopyBlock);
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    const TensorView::Entry& t = view.tensors[i];
    const uint64_t bytes = DataBytes(t);
    const uint64_t header_at = at;
    CKPTFS_RETURN_IF_ERROR(
        put(zip.LocalHeader(archive + "data/" + std::to_string(i), bytes, 0, at)));
    const uint64_t npy_header = t.npy.size() - bytes;  // the data follows the .npy header
    uLong crc = crc32(0, nullptr, 0);
    for (uint64_t off = 0; off < bytes;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - off));
      CKPTFS_ASSIGN_OR_RETURN(size_t n,
                              t.npy.Read(npy_header + off, MutableBytes(buf.data(), want), read));
      if (n != want) return Status::Corruption("tensor " + t.name + " is short");
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
      CKPTFS_RETURN_IF_ERROR(PWriteFull(fd.get(), at, Bytes(buf.data(), n), path));
      at += n;
      off += n;
      progress->Add(n);
    }
    zip.SetLastCrc(static_cast<uint32_t>(crc));
    std::string le(4, '\0');
    for (int b = 0; b < 4; ++b) le[b] = static_cast<char>((crc >> (8 * b)) & 0xff);
    CKPTFS_RETURN_IF_ERROR(
        PWriteFull(fd.get(), header_at + ZipWriter::kLocalHeaderCrcOffset, AsBytes(le), path));
  }
  CKPTFS_RETURN_IF_ERROR(put_record("version", "3\n"));
  CKPTFS_RETURN_IF_ERROR(put(zip.Finish(at)));
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync " + path.string());
  return at;
}

// A checkpoint file to read: its bytes, size and (when the store recorded it) layout.
struct Source {
  SourceReader read;
  uint64_t size = 0;
  std::optional<ContentLayout> layout;
  std::shared_ptr<void> keep;  // what `read` uses (an open store or file)
};

// The layout of bytes that the store did not describe (a file read through a mount): scanned.
Result<std::optional<ContentLayout>> ScanLayout(const SourceReader& read, uint64_t size) {
  LayoutScanner scanner;
  std::vector<std::byte> buf(kCopyBlock);
  for (uint64_t off = 0; off < size && !scanner.done();) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    CKPTFS_ASSIGN_OR_RETURN(size_t n, read(off, MutableBytes(buf.data(), want)));
    if (n == 0) break;
    Bytes data(buf.data(), n);
    while (!data.empty()) data = data.subspan(scanner.Scan(data));
    off += n;
  }
  ContentLayout layout = scanner.TakeLayout();
  if (layout.format == ContentLayout::Format::kNone) return std::optional<ContentLayout>();
  return std::optional<ContentLayout>(std::move(layout));
}

// A reader of the open file `fd` (a file in a mount), by pread.
SourceReader FileReader(std::shared_ptr<FileDescriptor> fd) {
  return [fd](uint64_t offset, MutableBytes out) -> Result<size_t> {
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = ::pread(fd->get(), out.data() + done, out.size() - done,
                          static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::FromErrno(errno, "read");
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  };
}

Result<Source> OpenSource(const std::string& spec) {
  if (auto m = CkptfsMountHolding(spec)) {  // through the mount
    auto fd = std::make_shared<FileDescriptor>(::open(spec.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd->get() < 0) return Status::FromErrno(errno, "open " + spec);
    struct stat st;
    if (::fstat(fd->get(), &st) != 0) return Status::FromErrno(errno, "stat " + spec);
    Source s;
    s.size = static_cast<uint64_t>(st.st_size);
    s.read = FileReader(fd);
    s.keep = fd;
    CKPTFS_ASSIGN_OR_RETURN(s.layout, ScanLayout(s.read, s.size));
    return s;
  }
  // STORE/VERSION/FILE: the nearest parent with a ckptfs.json is the store.
  fs::path p = fs::path(spec).lexically_normal();
  fs::path store;
  fs::path rest;
  for (fs::path q = p; q.has_relative_path() || q.has_root_path(); q = q.parent_path()) {
    std::error_code ec;
    if (fs::exists(q / "ckptfs.json", ec)) {
      store = q;
      rest = p.lexically_relative(q);
      break;
    }
    if (q == q.parent_path()) break;
  }
  if (store.empty()) {
    return Status::NotFound(spec + " is neither inside a ckptfs mount nor STORE/VERSION/FILE");
  }
  if (auto m = MountOfStore(store.string())) {
    return Status::Busy("the store " + store.string() + " is mounted at " + m->mountpoint +
                        ": give " + (fs::path(m->mountpoint) / rest).string());
  }
  auto it = rest.begin();
  if (it == rest.end() || std::next(it) == rest.end()) {
    return Status::InvalidArgument(spec + ": give STORE/VERSION/FILE");
  }
  const std::string version = it->string();
  const std::string path = fs::path(rest).lexically_relative(version).string();
  CKPTFS_ASSIGN_OR_RETURN(std::unique_ptr<Store> opened, OpenExistingStore(store.string()));
  std::shared_ptr<Store> st(std::move(opened));
  CKPTFS_ASSIGN_OR_RETURN(json files,
                          RunAdmin(st.get(), nullptr, {{"cmd", "files"}, {"version", version}}));
  for (const auto& f : files["files"]) {
    if (f["path"] != path) continue;
    if (f["type"] != "file") return Status::InvalidArgument(spec + " is not a regular file");
    Source s;
    s.size = U(f["size"]);
    ContentId content = U(f["content"]);
    s.read = [st, content](uint64_t offset, MutableBytes out) -> Result<size_t> {
      if (content == 0) return size_t{0};
      return st->Read(content, offset, out);
    };
    if (content != 0) {
      CKPTFS_ASSIGN_OR_RETURN(s.layout, st->GetLayout(content));
    }
    s.keep = st;
    return s;
  }
  return Status::NotFound("version " + version + " has no file " + path);
}

}  // namespace

int Diff(const std::string& target, const std::string& v1, const std::string& v2, bool as_json) {
  auto t = ResolveTarget(target);
  if (!t.ok()) return Fail(t.status());
  auto r = RunAdminOn(*t, {{"cmd", "diff"}, {"v1", v1}, {"v2", v2}});
  if (!r.ok()) return Fail(r.status());
  (*r)["store"] = RealPath(t->store);
  (*r)["mount"] = t->mount ? json(t->mount->mountpoint) : json();
  if (as_json) {
    PrintJson(*r);
    return kExitOk;
  }
  for (const auto& f : (*r)["files"]) {
    std::printf("%-9s %s\n", f["status"].get<std::string>().c_str(),
                f["path"].get<std::string>().c_str());
    if (f["tensors"].is_null() || f["status"] == "unchanged") continue;
    for (const auto& te : f["tensors"]) {
      if (te["status"] == "unchanged") continue;
      std::string detail;
      if (te["status"] == "changed" && !te["changed_fraction"].is_null()) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "  %.4g%% of elements",
                      100 * te["changed_fraction"].get<double>());
        detail = buf;
        if (!te["max_abs_diff"].is_null()) {
          std::snprintf(buf, sizeof(buf), ", max |diff| %.4g", te["max_abs_diff"].get<double>());
          detail += buf;
        }
      }
      std::printf("  %-9s %s (%s)%s\n", te["status"].get<std::string>().c_str(),
                  te["name"].get<std::string>().c_str(), te["dtype"].get<std::string>().c_str(),
                  detail.c_str());
    }
  }
  const json& s = (*r)["summary"];
  std::printf(
      "files: %llu unchanged, %llu changed, %llu added, %llu removed; tensors: %llu "
      "unchanged, %llu changed, %llu added, %llu removed\n",
      U(s["files"]["unchanged"]), U(s["files"]["changed"]), U(s["files"]["added"]),
      U(s["files"]["removed"]), U(s["tensors"]["unchanged"]), U(s["tensors"]["changed"]),
      U(s["tensors"]["added"]), U(s["tensors"]["removed"]));
  return kExitOk;
}

int Export(const std::string& source, const std::string& dest, const std::string& to,
           const std::string& dtype, bool as_json) {
  std::optional<DType> convert;
  if (dtype == "fp32") {
    convert = DType::kF32;
  } else if (dtype == "bf16") {
    convert = DType::kBF16;
  } else if (dtype == "fp16") {
    convert = DType::kF16;
  } else if (!dtype.empty()) {
    return Fail(Status::InvalidArgument("--dtype " + dtype + ": fp32, bf16 or fp16"));
  }
  auto src = OpenSource(source);
  if (!src.ok()) return Fail(src.status());
  auto view = BuildTensorView(src->read, src->size, src->layout, convert);
  if (!view.ok()) {
    return Fail(view.status(), source +
                                   " is not a torch.save or safetensors checkpoint "
                                   "ckptfs can parse");
  }
  std::error_code ec;
  if (fs::exists(dest, ec)) return Fail(Status::AlreadyExists(dest + " exists already"));
  uint64_t written = 0;
  ProgressLine line("export", as_json);
  uint64_t tensor_bytes = 0;
  for (const auto& t : (*view)->tensors) tensor_bytes += DataBytes(t);
  line.SetTotal(tensor_bytes);
  if (to == "npy") {
    uint64_t npy_bytes = 0;  // .npy headers included
    for (const auto& t : (*view)->tensors) npy_bytes += t.npy.size();
    line.SetTotal(npy_bytes);
    fs::create_directories(dest, ec);
    if (ec) return Fail(Status::IOError("create " + dest + ": " + ec.message()));
    for (const auto& t : (*view)->tensors) {
      Status s =
          CopyOut([&](uint64_t off, MutableBytes out) { return t.npy.Read(off, out, src->read); },
                  t.npy.size(), fs::path(dest) / t.file, 0644, &line);
      if (!s.ok()) return Fail(s);
      written += t.npy.size();
    }
    Status s = CopyOut(
        [&](uint64_t off, MutableBytes out) { return (*view)->index.Read(off, out, src->read); },
        (*view)->index.size(), fs::path(dest) / "index.json", 0644);
    if (!s.ok()) return Fail(s);
  } else if (to == "safetensors") {
    // Header: name -> {dtype, shape, data_offsets}, padded with spaces to 8 bytes.
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}, {"exported_by", "ckptfs " CKPTFS_VERSION}};
    uint64_t offset = 0;
    std::vector<std::pair<const TensorView::Entry*, uint64_t>> data;  // entry, data bytes
    for (const auto& t : (*view)->tensors) {
      const uint64_t bytes = DataBytes(t);
      header[t.name] = {{"dtype", std::string(SafetensorsName(t.dtype))},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + bytes}}};
      data.emplace_back(&t, bytes);
      offset += bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string prefix(8, '\0');
    uint64_t len = text.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((len >> (8 * i)) & 0xff);
    prefix += text;
    const uint64_t total = prefix.size() + offset;
    line.SetTotal(total);
    // One virtual file: the header, then each tensor's .npy data (after its .npy header).
    Status s = CopyOut(
        [&](uint64_t off, MutableBytes out) -> Result<size_t> {
          size_t done = 0;
          uint64_t at = 0;
          if (off < prefix.size()) {
            size_t n = std::min<size_t>(out.size(), prefix.size() - off);
            std::memcpy(out.data(), prefix.data() + off, n);
            done = n;
          }
          at = prefix.size();
          for (const auto& [t, bytes] : data) {
            if (done == out.size()) break;
            const uint64_t pos = off + done;
            if (pos >= at + bytes) {
              at += bytes;
              continue;
            }
            const uint64_t in = pos - at;
            const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size() - done, bytes - in));
            const uint64_t npy_header = t->npy.size() - bytes;
            CKPTFS_ASSIGN_OR_RETURN(size_t got,
                                    t->npy.Read(npy_header + in, out.subspan(done, n), src->read));
            if (got != n) return Status::Corruption("tensor " + t->name + " is short");
            done += n;
            at += bytes;
          }
          return done;
        },
        total, dest, 0644, &line);
    if (!s.ok()) return Fail(s);
    written = total;
  } else if (to == "pt") {
    auto total = WriteTorchFile(**view, src->read, dest, &line);
    if (!total.ok()) return Fail(total.status());
    written = *total;
  } else {
    return Fail(Status::InvalidArgument("--to " + to + ": pt, safetensors or npy"));
  }
  line.Done();
  if (as_json) {
    PrintJson({{"source", source},
               {"dest", RealPath(dest)},
               {"to", to},
               {"dtype", dtype.empty() ? json() : json(dtype)},
               {"tensors", (*view)->tensors.size()},
               {"bytes", written}});
  } else {
    std::printf("exported %zu tensors of %s to %s (%s, %s)\n", (*view)->tensors.size(),
                source.c_str(), dest.c_str(), to.c_str(), HumanBytes(written).c_str());
  }
  return kExitOk;
}

int Restore(const std::string& target, const std::string& version, const std::string& dir,
            bool as_json) {
  auto t = ResolveTarget(target);
  if (!t.ok()) return Fail(t.status());
  std::error_code ec;
  if (fs::exists(dir, ec)) return Fail(Status::AlreadyExists(dir + " exists already"));
  // What the version holds (a directory's tree, or a file version's one file: docs/fs.md),
  // from the daemon or the store; the bytes then come through the mount (so that the kernel's
  // view is the one copied) or from the store.
  std::unique_ptr<Store> store;
  if (!t->mount) {
    auto opened = OpenExistingStore(t->store);
    if (!opened.ok()) return Fail(opened.status());
    store = std::move(*opened);
  }
  const json request = {{"cmd", "files"}, {"version", version}};
  auto list = t->mount ? RunAdminOn(*t, request) : RunAdmin(store.get(), nullptr, request);
  if (!list.ok()) return Fail(list.status());
  uint64_t files = 0, bytes = 0, total = 0;
  for (const auto& f : (*list)["files"]) total += f["type"] == "file" ? U(f["size"]) : 0;
  fs::path mounted;  // the version in the mount: a directory, or a file version's file
  if (t->mount) mounted = fs::path(t->mount->mountpoint) / version;
  const bool file_version = t->mount && !fs::is_directory(mounted, ec);
  ProgressLine line("restore", as_json);
  line.SetTotal(total);
  fs::create_directories(dir, ec);
  if (ec) return Fail(Status::IOError("create " + dir + ": " + ec.message()));
  for (const auto& f : (*list)["files"]) {
    const std::string rel = f["path"].get<std::string>();
    const fs::path path = fs::path(dir) / rel;
    const std::string type = f["type"].get<std::string>();
    if (type == "dir") {
      fs::create_directories(path, ec);
      if (ec) return Fail(Status::IOError("create " + path.string() + ": " + ec.message()));
      continue;
    }
    if (type == "symlink") {
      fs::create_symlink(f["symlink"].get<std::string>(), path, ec);
      if (ec) return Fail(Status::IOError("symlink " + path.string() + ": " + ec.message()));
      continue;
    }
    SourceReader read;
    if (t->mount) {
      const fs::path from = file_version ? mounted : mounted / rel;
      auto fd = std::make_shared<FileDescriptor>(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd->get() < 0) return Fail(Status::FromErrno(errno, "open " + from.string()));
      read = FileReader(fd);
    } else {
      read = [st = store.get(), content = ContentId{U(f["content"])}](
                 uint64_t off, MutableBytes out) -> Result<size_t> {
        if (content == 0) return size_t{0};
        return st->Read(content, off, out);
      };
    }
    Status s = CopyOut(read, U(f["size"]), path, static_cast<mode_t>(U(f["mode"]) & 07777), &line);
    if (!s.ok()) return Fail(s);
    ++files;
    bytes += U(f["size"]);
  }
  line.Done();
  if (as_json) {
    PrintJson({{"store", RealPath(t->store)},
               {"mount", t->mount ? json(t->mount->mountpoint) : json()},
               {"version", version},
               {"dir", RealPath(dir)},
               {"files", files},
               {"bytes", bytes}});
  } else {
    std::printf("restored %s: %llu files, %s into %s\n", version.c_str(),
                static_cast<unsigned long long>(files), HumanBytes(bytes).c_str(), dir.c_str());
  }
  return kExitOk;
}

}  // namespace ckptfs::cli
