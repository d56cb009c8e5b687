// Requests of the `ckptfs` command (engine/namespace/admin.h).
#include "engine/namespace/admin.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "engine/format/dtype.h"
#include "engine/format/torch_pickle.h"
#include "engine/namespace/file_versions.h"
#include "engine/namespace/inode.h"
#include "engine/util/thread_role.h"
#include "engine/views/convert.h"
#include "engine/views/tensor_view.h"

namespace ckptfs {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxMetadataFileBytes = 1 << 20;

// The entries of directory `dir` as (name, inode number), in name order.
Result<std::vector<std::pair<std::string, Ino>>> Children(const Catalog::ReadTxn& txn, Ino dir,
                                                          bool dirs_only = false) {
  CKPTFS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ListDirents(txn, dir));
  std::vector<std::pair<std::string, Ino>> children;
  for (DirEntry& e : entries) {
    if (!dirs_only || S_ISDIR(e.mode)) children.emplace_back(std::move(e.name), e.ino);
  }
  return children;
}

struct FileInfo {
  std::string path;  // relative to its version
  Inode inode;
};

// The regular files and symlinks under `dir`, depth first, in name order.
Status WalkTree(const Catalog::ReadTxn& txn, Ino dir, const std::string& prefix,
                std::vector<FileInfo>* out) {
  CKPTFS_ASSIGN_OR_RETURN(auto children, Children(txn, dir));
  for (const auto& [name, ino] : children) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, ino));
    if (!inode) return Status::Corruption("directory entry " + prefix + name + " has no inode");
    if (inode->is_dir()) {
      CKPTFS_RETURN_IF_ERROR(WalkTree(txn, ino, prefix + name + "/", out));
    } else {
      out->push_back({prefix + name, *inode});
    }
  }
  return Status::OK();
}

// A version: a top-level directory (named by its name) or a file version (file_versions.h,
// named by its path from the mount root).
struct Version {
  Inode inode;
  std::string name;
};

// Every version in creation order. A top-level directory that holds file versions is their
// container, not a version.
Result<std::vector<Version>> ListVersions(const Catalog::ReadTxn& txn) {
  std::vector<Version> versions;
  CKPTFS_ASSIGN_OR_RETURN(auto dirs, Children(txn, kRootIno, /*dirs_only=*/true));
  for (const auto& [name, ino] : dirs) {
    CKPTFS_ASSIGN_OR_RETURN(bool container, HoldsFileVersions(txn, ino));
    if (container) continue;
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, ino));
    if (inode) versions.push_back({*inode, name});
  }
  CKPTFS_ASSIGN_OR_RETURN(auto files, ListFileVersions(txn));
  for (auto& f : files) versions.push_back({std::move(f.inode), std::move(f.path)});
  std::sort(versions.begin(), versions.end(), [](const Version& a, const Version& b) {
    return a.inode.version_seq < b.inode.version_seq;
  });
  return versions;
}

// The version called `name`: a top-level directory, or a file version by its path.
Result<Version> FindVersion(const Catalog::ReadTxn& txn, std::string name) {
  while (!name.empty() && name.back() == '/') name.pop_back();
  const Status not_found = Status::NotFound("no version named '" + name + "'");
  if (name.empty()) return not_found;
  Ino at = kRootIno;
  std::optional<Inode> inode;
  for (size_t begin = 0; begin != std::string::npos;) {
    const size_t slash = name.find('/', begin);
    const std::string part =
        name.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    begin = slash == std::string::npos ? slash : slash + 1;
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Ino> child, GetDirent(txn, at, part));
    if (!child) return not_found;
    CKPTFS_ASSIGN_OR_RETURN(inode, GetInode(txn, *child));
    if (!inode) return not_found;
    at = *child;
  }
  if ((inode->is_dir() && inode->parent == kRootIno) || inode->file_version()) {
    return Version{*inode, name};
  }
  return not_found;
}

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The files of a version: a directory's tree, or a file version's one file (its base name).
Status VersionTree(const Catalog::ReadTxn& txn, const Version& v, std::vector<FileInfo>* out) {
  if (v.inode.is_dir()) return WalkTree(txn, v.inode.ino, "", out);
  out->push_back({BaseName(v.name), v.inode});
  return Status::OK();
}

std::string FormatName(ContentLayout::Format f) {
  switch (f) {
    case ContentLayout::Format::kTorchZip:
      return "torch";
    case ContentLayout::Format::kSafetensors:
      return "safetensors";
    default:
      return "";
  }
}

// A small JSON file of the version, parsed (never executed); discarded when not JSON.
json ReadJsonFile(const Store& store, const Inode& file) {
  if (file.content == 0 || file.size > kMaxMetadataFileBytes) return json();
  std::string text(file.size, '\0');
  auto n = store.Read(file.content, 0,
                      MutableBytes(reinterpret_cast<std::byte*>(text.data()), text.size()));
  if (!n.ok()) return json();
  text.resize(*n);
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The root dict's scalars of a torch file's data.pkl (torch_pickle.h: parsed, never run);
// empty for anything else.
std::vector<TorchScalar> PickleScalars(const Store& store, const Inode& file) {
  if (!file.is_reg() || file.content == 0) return {};
  auto layout = store.GetLayout(file.content);
  if (!layout.ok() || !*layout || (*layout)->format != ContentLayout::Format::kTorchZip) return {};
  SourceReader read = [&store, content = file.content](uint64_t offset, MutableBytes out) {
    return store.Read(content, offset, out);
  };
  std::string prefix;
  auto pkl = ReadTorchPickle(read, **layout, &prefix);
  if (!pkl.ok()) return {};
  auto index = ParseTorchPickle(AsBytes(*pkl));
  if (!index.ok()) return {};
  return std::move(index->scalars);
}

// What a checkpoint's own top-level entries say: the step (Lightning's and most loops'
// 'global_step', DeepSpeed's 'global_steps'), 'epoch', and the framework's version
// ('pytorch-lightning_version', DeepSpeed's 'ds_version'). Fills only what is still null.
void PickleMetadata(const std::vector<TorchScalar>& scalars, const std::string& path, json* meta,
                    bool* deepspeed, bool* lightning) {
  for (const char* step_key : {"global_step", "global_steps"}) {
    for (const TorchScalar& s : scalars) {
      if (s.key == step_key && s.kind == TorchScalar::Kind::kInt && s.i >= 0 &&
          (*meta)["global_step"].is_null()) {
        (*meta)["global_step"] = s.i;
        (*meta)["step_source"] = path;
      }
    }
  }
  for (const TorchScalar& s : scalars) {
    if (s.key == "epoch" && s.kind == TorchScalar::Kind::kInt && s.i >= 0 &&
        (*meta)["epoch"].is_null()) {
      (*meta)["epoch"] = s.i;
    } else if (s.kind == TorchScalar::Kind::kString && s.key == "pytorch-lightning_version") {
      (*meta)["framework"]["pytorch_lightning"] = s.text;
      *lightning = true;
    } else if (s.kind == TorchScalar::Kind::kString && s.key == "ds_version") {
      (*meta)["framework"]["deepspeed"] = s.text;
      *deepspeed = true;
    }
  }
}

// What the version's files say about the training run, without running pickle code.
json VersionMetadata(const Store& store, const std::vector<FileInfo>& files,
                     const std::string& version_name) {
  json meta = {{"layout", nullptr},
               {"global_step", nullptr},
               {"step_source", nullptr},
               {"epoch", nullptr},
               {"framework", json::object()}};
  bool hf = false, deepspeed = false, lightning = false, snapshot = false;
  // Torch pickles are read (data.pkl only) until one gave a step, at most this many.
  constexpr int kMaxPicklesRead = 4;
  int pickles_read = 0;
  for (const auto& f : files) {
    const std::string base = BaseName(f.path);
    if (base == "trainer_state.json") {
      hf = true;
      json state = ReadJsonFile(store, f.inode);
      if (state.is_object() && state.contains("global_step") &&
          state["global_step"].is_number_integer()) {
        meta["global_step"] = state["global_step"];
        meta["step_source"] = f.path;
      }
    } else if (base == "config.json") {
      json config = ReadJsonFile(store, f.inode);
      if (config.is_object() && config.contains("transformers_version") &&
          config["transformers_version"].is_string()) {
        hf = true;
        meta["framework"]["transformers"] = config["transformers_version"];
      }
    } else if (base.ends_with("_model_states.pt") || base.ends_with("_optim_states.pt")) {
      deepspeed = true;
    } else if (base.ends_with(".ckpt")) {
      lightning = true;
    } else if (f.path == "manifest.json") {
      json manifest = ReadJsonFile(store, f.inode);
      if (manifest.is_object() && manifest.value("format", "") == "ckptfs-sharded-1") {
        snapshot = true;
      }
    }
  }
  // Then the checkpoints' own entries (after trainer_state.json, which HF writes for this).
  for (const auto& f : files) {
    if (!meta["global_step"].is_null() || pickles_read >= kMaxPicklesRead) break;
    std::vector<TorchScalar> scalars = PickleScalars(store, f.inode);
    if (scalars.empty()) continue;
    ++pickles_read;
    PickleMetadata(scalars, f.path, &meta, &deepspeed, &lightning);
  }
  if (hf) {
    meta["layout"] = "huggingface";
  } else if (deepspeed) {
    meta["layout"] = "deepspeed";
  } else if (lightning) {
    meta["layout"] = "lightning";
  } else if (snapshot) {
    meta["layout"] = "ckptfs-snapshot";
  }
  // The step from the name (global_step2000, checkpoint-500, step_100), when no file said.
  if (meta["global_step"].is_null()) {
    // A file version's name without its suffix: epoch=3-step=400.ckpt, ckpt_100.pt.
    std::string stem = BaseName(version_name);
    if (IsCheckpointFileName(stem)) stem.resize(stem.rfind('.'));
    size_t end = stem.size();
    size_t begin = end;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(stem[begin - 1]))) --begin;
    if (begin < end && end - begin <= 18 && begin > 0) {
      meta["global_step"] = std::stoull(stem.substr(begin));
      meta["step_source"] = "name";
    }
  }
  return meta;
}

Result<json> Log(Store* store, const json& request) {
  const std::string only = request.value("version", "");
  const bool with_files = request.value("files", false) || !only.empty();
  // Added bytes are measured on the final encoding: the re-encoder turns a version's pieces
  // whole and its predecessor's into deltas after the commit, which moves stored bytes from
  // one version to the next (docs/cli.md "log"). Waiting makes the figures one answer, not
  // however far the re-encoder got.
  store->WaitReencoded();
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::vector<Version> versions, ListVersions(txn));
  // A chunk counts as added by the first version (in creation order) whose files use it.
  std::unordered_set<ChunkId> seen;
  json out = json::array();
  bool found = only.empty();
  for (const auto& v : versions) {
    std::vector<FileInfo> files;
    CKPTFS_RETURN_IF_ERROR(VersionTree(txn, v, &files));
    std::sort(files.begin(), files.end(),
              [](const FileInfo& a, const FileInfo& b) { return a.path < b.path; });
    uint64_t logical = 0, added = 0, created = 0, count = 0;
    std::string digest_input;
    json file_list = json::array();
    json formats = json::object();
    for (const auto& f : files) {
      if (!f.inode.is_reg()) continue;
      ++count;
      logical += f.inode.size;
      uint64_t file_added = 0;
      digest_input += f.path;
      digest_input.push_back('\0');
      digest_input += std::to_string(f.inode.size);
      digest_input.push_back('\0');
      json layout_info;
      if (f.inode.content != 0) {
        CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> row, txn.GetContent(f.inode.content));
        if (row && (created == 0 || row->created_unix_ns < created)) {
          created = row->created_unix_ns;
        }
        Status err;
        CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(f.inode.content, 0, [&](const ChunkRef& ref) {
          digest_input.append(reinterpret_cast<const char*>(ref.id.bytes.data()),
                              ref.id.bytes.size());
          if (seen.insert(ref.id).second) {
            auto chunk = txn.GetChunk(ref.id);
            if (!chunk.ok()) {
              err = chunk.status();
              return false;
            }
            if (*chunk) file_added += (*chunk)->length;
          }
          return true;
        }));
        CKPTFS_RETURN_IF_ERROR(err);
        CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentLayout> layout,
                                store->GetLayout(f.inode.content));
        if (layout && layout->format != ContentLayout::Format::kNone) {
          const std::string fmt = FormatName(layout->format);
          formats[fmt] = formats.value(fmt, 0) + 1;
          uint64_t tensors = 0;
          for (const auto& s : layout->sections) tensors += s.dtype ? 1 : 0;
          layout_info = {{"format", fmt}, {"tensors", tensors}};
        }
      }
      added += file_added;
      if (with_files) {
        json entry = {{"path", f.path},
                      {"size", f.inode.size},
                      {"added_bytes", file_added},
                      {"format", layout_info.is_null() ? json() : layout_info["format"]},
                      {"tensors", layout_info.is_null() ? json() : layout_info["tensors"]}};
        file_list.push_back(entry);
      }
    }
    if (!only.empty() && v.name != only) continue;
    found = true;
    json entry = {
        {"seq", v.inode.version_seq},
        {"name", v.name},
        {"kind", v.inode.is_dir() ? "directory" : "file"},
        {"created_unix_ns", created != 0 ? created : static_cast<uint64_t>(v.inode.mtime_ns)},
        {"modified_unix_ns", static_cast<uint64_t>(v.inode.mtime_ns)},
        {"sealed", v.inode.sealed()},
        {"files", count},
        {"logical_bytes", logical},
        {"added_bytes", added},
        {"ratio", logical > 0 ? static_cast<double>(added) / static_cast<double>(logical) : 0.0},
        {"manifest_digest", ChunkId::Of(AsBytes(digest_input)).Hex()},
        {"formats", formats},
        {"metadata", VersionMetadata(*store, files, v.name)}};
    if (with_files) entry["file_list"] = file_list;
    out.push_back(entry);
  }
  if (!found) return Status::NotFound("no version named '" + only + "'");
  return json{{"versions", out}};
}

json StatsOf(const Store& store, const StoreStats& st) {
  const auto& by = st.chunks_by_transform;
  return {{"contents", st.contents},
          {"logical_bytes", st.logical_bytes},
          {"chunks", st.chunks},
          {"chunk_bytes", st.chunk_bytes},
          {"record_bytes", st.record_bytes},
          {"pack_bytes", st.pack_bytes},
          {"packs", st.packs},
          {"plain_chunks", by[0]},
          {"planes_chunks", by[1]},
          {"delta_chunks", by[2] + by[3]},
          {"longest_chain", st.max_depth},
          {"stored_over_logical", st.logical_bytes > 0 ? static_cast<double>(st.pack_bytes) /
                                                             static_cast<double>(st.logical_bytes)
                                                       : 0.0},
          {"pack_read_bytes", store.pack_read_bytes()},
          {"pack_reads", store.pack_reads()},
          {"cache_hits", store.cache_hits()},
          {"cache_misses", store.cache_misses()},
          {"prefetch_loads", store.prefetch_loads()},
          {"read_loads", store.read_loads()}};
}

json LatencyOf(const LatencyHistogram& h) {
  return {{"count", h.count()},
          {"p50_us", static_cast<double>(h.Percentile(0.50)) / 1e3},
          {"p99_us", static_cast<double>(h.Percentile(0.99)) / 1e3}};
}

// Seconds since this process started (from /proc/self/stat and /proc/uptime).
double ProcessUptimeSeconds() {
  std::ifstream stat("/proc/self/stat"), up("/proc/uptime");
  std::string line;
  double uptime = 0;
  if (!std::getline(stat, line) || !(up >> uptime)) return 0;
  size_t paren = line.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(line.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return uptime - std::stod(field) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  return 0;
}

// A committed file's size is its content's: a catalog where they differ is damaged (one
// flipped byte in the inode row made restore copy 4 MiB + 17 of a 5 MiB + 17 file, exit 0).
Status CheckFileSize(const Catalog::ReadTxn& txn, const std::string& path, const Inode& inode) {
  if (inode.is_dir() || inode.is_symlink() || inode.content == 0) return Status::OK();
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> row, txn.GetContent(inode.content));
  if (row && row->size == inode.size) return Status::OK();
  return Status::Corruption(
      "file " + path + ": the catalog says " + std::to_string(inode.size) + " bytes, " +
      (row ? "its content holds " + std::to_string(row->size)
           : "its content " + std::to_string(inode.content) + " is missing") +
      "; the catalog is damaged (`ckptfs verify`), restore this file from elsewhere");
}

// Every entry under `dir` (directories before what they hold), for restore and export.
Status WalkAll(const Catalog::ReadTxn& txn, Ino dir, const std::string& prefix, json* out) {
  CKPTFS_ASSIGN_OR_RETURN(auto children, Children(txn, dir));
  for (const auto& [name, ino] : children) {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Inode> inode, GetInode(txn, ino));
    if (!inode) return Status::Corruption("directory entry " + prefix + name + " has no inode");
    CKPTFS_RETURN_IF_ERROR(CheckFileSize(txn, prefix + name, *inode));
    const char* type = inode->is_dir() ? "dir" : inode->is_symlink() ? "symlink" : "file";
    out->push_back({{"path", prefix + name},
                    {"type", type},
                    {"size", inode->size},
                    {"mode", inode->mode},
                    {"content", inode->content},
                    {"symlink", inode->symlink}});
    if (inode->is_dir()) CKPTFS_RETURN_IF_ERROR(WalkAll(txn, ino, prefix + name + "/", out));
  }
  return Status::OK();
}

Result<json> Files(Store* store, const json& request) {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(Version v, FindVersion(txn, request.value("version", "")));
  json files = json::array();
  if (v.inode.is_dir()) {
    CKPTFS_RETURN_IF_ERROR(WalkAll(txn, v.inode.ino, "", &files));
  } else {  // a file version: its one file
    CKPTFS_RETURN_IF_ERROR(CheckFileSize(txn, v.name, v.inode));
    files.push_back({{"path", BaseName(v.name)},
                     {"type", "file"},
                     {"size", v.inode.size},
                     {"mode", v.inode.mode},
                     {"content", v.inode.content},
                     {"symlink", ""}});
  }
  return json{{"files", files}};
}

// ---- save cost (`ckptfs advise`) ----------------------------------------------------------

// What the recent versions say about the cost of a save (docs/cli.md "advise"). A version's
// save began when its directory (a file version: its file) was created, which its atime
// records (reads do not change it here; only an explicit utime does), and ended when the
// last of its files' commits finished, which its content row records: that span is the save
// as the job lived it (serialising, writing, the store's hashing, compression and fsync).
// A version is not measured when its times do not read as one save: a file created before
// the version or written after its commit, or committed long after its last write (times
// kept by `cp -a`, `tar`, rsync), or when it is the newest version and not sealed (it may
// still be being written).
Result<json> SaveCost(Store* store, const json& request) {
  // A file's last write to its commit: the write queue draining, then the commit itself.
  constexpr int64_t kMaxCommitLagNs = 10'000'000'000;
  const uint64_t most = std::max<uint64_t>(1, request.value("versions", uint64_t{5}));
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::vector<Version> versions, ListVersions(txn));
  json measured = json::array();
  uint64_t unmeasured = 0;
  for (auto v = versions.rbegin(); v != versions.rend() && measured.size() < most; ++v) {
    if (v == versions.rbegin() && !v->inode.sealed()) {
      ++unmeasured;
      continue;
    }
    std::vector<FileInfo> files;
    CKPTFS_RETURN_IF_ERROR(VersionTree(txn, *v, &files));
    const int64_t start = v->inode.atime_ns;
    int64_t end = 0;
    uint64_t logical = 0;
    bool one_save = true;
    for (const auto& f : files) {
      if (!f.inode.is_reg() || f.inode.content == 0) continue;
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentRow> row, txn.GetContent(f.inode.content));
      if (!row) continue;
      const auto commit = static_cast<int64_t>(row->created_unix_ns);
      one_save = one_save && start <= f.inode.atime_ns && f.inode.atime_ns <= f.inode.mtime_ns &&
                 f.inode.mtime_ns <= commit && commit - f.inode.mtime_ns <= kMaxCommitLagNs;
      logical += f.inode.size;
      end = std::max(end, commit);
    }
    if (!one_save || end <= start) {
      ++unmeasured;
      continue;
    }
    const double seconds = static_cast<double>(end - start) / 1e9;
    measured.push_back({{"name", v->name},
                        {"logical_bytes", logical},
                        {"started_unix_ns", start},
                        {"finished_unix_ns", end},
                        {"save_seconds", seconds},
                        {"bytes_per_second", static_cast<double>(logical) / seconds}});
  }
  return json{{"versions", versions.size()}, {"unmeasured", unmeasured}, {"measured", measured}};
}

// ---- diff ---------------------------------------------------------------------------------

// The files of version `name` by path (NotFound if there is no such version).
Result<std::map<std::string, Inode>> VersionFiles(const Catalog::ReadTxn& txn,
                                                  const std::string& name) {
  CKPTFS_ASSIGN_OR_RETURN(Version v, FindVersion(txn, name));
  std::vector<FileInfo> files;
  CKPTFS_RETURN_IF_ERROR(VersionTree(txn, v, &files));
  std::map<std::string, Inode> out;
  for (auto& f : files) {
    if (f.inode.is_reg()) out.emplace(f.path, f.inode);
  }
  return out;
}

Result<std::vector<ChunkId>> ChunkList(const Catalog::ReadTxn& txn, ContentId content) {
  std::vector<ChunkId> ids;
  if (content == 0) return ids;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(content, 0, [&](const ChunkRef& ref) {
    ids.push_back(ref.id);
    return true;
  }));
  return ids;
}

bool ToDoubles(DType t, const std::byte* p, size_t n, std::vector<double>* out) {
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kF64: {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        (*out)[i] = v;
        break;
      }
      case DType::kF32: {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        (*out)[i] = v;
        break;
      }
      case DType::kF16:
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        (*out)[i] = t == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

// Compares one tensor's data in both files, a bounded block at a time.
Result<json> CompareTensor(const TensorView::Entry& a, const SourceReader& ra,
                           const TensorView::Entry& b, const SourceReader& rb) {
  json out = {{"name", a.name}, {"dtype", std::string(DTypeName(b.dtype))}, {"shape", b.shape}};
  uint64_t elements = 1;
  for (uint64_t d : b.shape) elements *= d;
  const size_t width = ElementSize(b.dtype);
  const uint64_t bytes = elements * width;
  out["bytes"] = bytes;
  if (a.dtype != b.dtype || a.shape != b.shape) {
    out["status"] = "changed";
    out["max_abs_diff"] = nullptr;
    out["changed_fraction"] = nullptr;
    return out;
  }
  const uint64_t ha = a.npy.size() - bytes, hb = b.npy.size() - bytes;
  constexpr size_t kBlock = 1 << 20;
  const size_t block = kBlock - kBlock % width;
  std::vector<std::byte> ba(block), bb(block);
  std::vector<double> da, db;
  const bool floating =
      IsFloating(b.dtype) && b.dtype != DType::kF8E4M3 && b.dtype != DType::kF8E5M2;
  uint64_t changed = 0;
  double max_abs = 0;
  for (uint64_t off = 0; off < bytes; off += block) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block, bytes - off));
    CKPTFS_ASSIGN_OR_RETURN(size_t got_a, a.npy.Read(ha + off, MutableBytes(ba.data(), n), ra));
    CKPTFS_ASSIGN_OR_RETURN(size_t got_b, b.npy.Read(hb + off, MutableBytes(bb.data(), n), rb));
    if (got_a != n || got_b != n) return Status::Corruption("tensor " + a.name + " is short");
    if (std::memcmp(ba.data(), bb.data(), n) == 0) continue;
    if (floating && ToDoubles(b.dtype, ba.data(), n / width, &da) &&
        ToDoubles(b.dtype, bb.data(), n / width, &db)) {
      for (size_t i = 0; i < da.size(); ++i) {
        if (std::memcmp(ba.data() + i * width, bb.data() + i * width, width) == 0) continue;
        ++changed;
        double d = std::fabs(da[i] - db[i]);
        if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
        max_abs = std::max(max_abs, d);
      }
    } else {
      for (size_t i = 0; i < n / width; ++i) {
        changed += std::memcmp(ba.data() + i * width, bb.data() + i * width, width) != 0;
      }
    }
  }
  out["status"] = changed == 0 ? "unchanged" : "changed";
  out["changed_fraction"] =
      elements > 0 ? static_cast<double>(changed) / static_cast<double>(elements) : 0.0;
  out["max_abs_diff"] = floating && std::isfinite(max_abs) ? json(max_abs) : json();
  return out;
}

Result<json> Diff(Store* store, const json& request) {
  const std::string v1 = request.value("v1", ""), v2 = request.value("v2", "");
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(auto before, VersionFiles(txn, v1));
  CKPTFS_ASSIGN_OR_RETURN(auto after, VersionFiles(txn, v2));
  if (before.size() == 1 && after.size() == 1 && FindVersion(txn, v1)->inode.file_version() &&
      FindVersion(txn, v2)->inode.file_version()) {
    // Two file versions (epoch=0-step=10.ckpt, epoch=0-step=20.ckpt): one file, compared.
    after = {{before.begin()->first, after.begin()->second}};
  }
  std::set<std::string> paths;
  for (const auto& [p, _] : before) paths.insert(p);
  for (const auto& [p, _] : after) paths.insert(p);
  json files = json::array();
  std::map<std::string, uint64_t> file_counts = {
      {"unchanged", 0}, {"changed", 0}, {"added", 0}, {"removed", 0}};
  std::map<std::string, uint64_t> tensor_counts = file_counts;
  for (const auto& path : paths) {
    auto a = before.find(path);
    auto b = after.find(path);
    json entry = {{"path", path},
                  {"size_before", a == before.end() ? json() : json(a->second.size)},
                  {"size_after", b == after.end() ? json() : json(b->second.size)},
                  {"tensors", nullptr}};
    std::string status;
    if (a == before.end()) {
      status = "added";
    } else if (b == after.end()) {
      status = "removed";
    } else {
      CKPTFS_ASSIGN_OR_RETURN(auto ca, ChunkList(txn, a->second.content));
      CKPTFS_ASSIGN_OR_RETURN(auto cb, ChunkList(txn, b->second.content));
      status = ca == cb && a->second.size == b->second.size ? "unchanged" : "changed";
    }
    // Per tensor, where both sides (or the one side) parse as checkpoints.
    auto view_of =
        [&](const Inode& f) -> std::pair<std::shared_ptr<const TensorView>, SourceReader> {
      SourceReader read = [store, content = f.content](uint64_t offset, MutableBytes out) {
        return store->Read(content, offset, out);
      };
      if (f.content == 0) return {nullptr, read};
      auto layout = store->GetLayout(f.content);
      if (!layout.ok() || !*layout) return {nullptr, read};
      auto view = BuildTensorView(read, f.size, *layout, std::nullopt);
      return {view.ok() ? *view : nullptr, read};
    };
    std::pair<std::shared_ptr<const TensorView>, SourceReader> va, vb;
    if (a != before.end()) va = view_of(a->second);
    if (b != after.end()) vb = view_of(b->second);
    if (va.first || vb.first) {
      json tensors = json::array();
      std::map<std::string, const TensorView::Entry*> ta;
      if (va.first) {
        for (const auto& t : va.first->tensors) ta.emplace(t.name, &t);
      }
      std::set<std::string> seen_names;
      if (vb.first) {
        for (const auto& t : vb.first->tensors) {
          seen_names.insert(t.name);
          auto it = ta.find(t.name);
          json te;
          if (it == ta.end()) {
            te = {{"name", t.name},
                  {"status", "added"},
                  {"dtype", std::string(DTypeName(t.dtype))},
                  {"shape", t.shape},
                  {"bytes", t.npy.size()},
                  {"max_abs_diff", nullptr},
                  {"changed_fraction", nullptr}};
          } else if (status == "unchanged") {
            uint64_t elements = 1;
            for (uint64_t d : t.shape) elements *= d;
            te = {{"name", t.name},
                  {"status", "unchanged"},
                  {"dtype", std::string(DTypeName(t.dtype))},
                  {"shape", t.shape},
                  {"bytes", elements * ElementSize(t.dtype)},
                  {"max_abs_diff", 0.0},
                  {"changed_fraction", 0.0}};
          } else {
            CKPTFS_ASSIGN_OR_RETURN(te, CompareTensor(*it->second, va.second, t, vb.second));
          }
          tensor_counts[te["status"].get<std::string>()]++;
          tensors.push_back(te);
        }
      }
      for (const auto& [name, t] : ta) {
        if (seen_names.count(name)) continue;
        tensors.push_back({{"name", name},
                           {"status", "removed"},
                           {"dtype", std::string(DTypeName(t->dtype))},
                           {"shape", t->shape},
                           {"bytes", nullptr},
                           {"max_abs_diff", nullptr},
                           {"changed_fraction", nullptr}});
        tensor_counts["removed"]++;
      }
      entry["tensors"] = tensors;
    }
    entry["status"] = status;
    file_counts[status]++;
    files.push_back(entry);
  }
  return json{{"v1", v1},
              {"v2", v2},
              {"files", files},
              {"summary", {{"files", file_counts}, {"tensors", tensor_counts}}}};
}

// The retention rules of `ckptfs forget` and of a mount's --keep-last (docs/cli.md "forget"):
// versions in creation order; kept are the last N, every K-th version the store created (by
// sequence number: 1, 1+K, 1+2K, ...; stable as versions are forgotten, so that rotation keeps
// them) and every version not sealed; the others are to be forgotten.
Result<json> ForgetPlan(Store* store, const json& request) {
  const uint64_t keep_last = request.value("keep_last", uint64_t{0});
  const uint64_t keep_every = request.value("keep_every", uint64_t{0});
  if (keep_last < 1) return Status::InvalidArgument("--keep-last must be at least 1");
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
  CKPTFS_ASSIGN_OR_RETURN(std::vector<Version> versions, ListVersions(txn));
  const size_t n = versions.size();
  json kept = json::array(), forgotten = json::array();
  for (size_t i = 0; i < n; ++i) {
    std::string why;
    if (i + keep_last >= n) {
      why = "last " + std::to_string(keep_last);
    } else if (keep_every > 0 && (versions[i].inode.version_seq - 1) % keep_every == 0) {
      why = "every " + std::to_string(keep_every);
    } else if (!versions[i].inode.sealed()) {
      why = "not sealed";
    }
    json entry = {{"name", versions[i].name}, {"seq", versions[i].inode.version_seq}};
    if (why.empty()) {
      forgotten.push_back(entry);
    } else {
      entry["reason"] = why;
      kept.push_back(entry);
    }
  }
  return json{{"kept", kept}, {"forgotten", forgotten}};
}

Status RemoveTree(FileSystem* fs, Ino parent, const std::string& name) {
  CKPTFS_ASSIGN_OR_RETURN(Inode inode, fs->Lookup(parent, name));
  if (!inode.is_dir()) return fs->Unlink(parent, name);
  std::vector<DirEntry> children;
  CKPTFS_ASSIGN_OR_RETURN(uint64_t dh, fs->OpenDir(inode.ino));
  Status listed = fs->ReadDir(dh, 0, [&](const DirEntry& e, uint64_t) {
    children.push_back(e);
    return true;
  });
  fs->ReleaseDir(dh);
  CKPTFS_RETURN_IF_ERROR(listed);
  for (const auto& c : children) {
    if (c.name == "." || c.name == "..") continue;
    CKPTFS_RETURN_IF_ERROR(RemoveTree(fs, inode.ino, c.name));
  }
  return fs->Rmdir(parent, name);
}

// ---- verify -------------------------------------------------------------------------------

// Where the damaged chunks of `report` are: per file (path from the mount root) that holds one,
// its version (the path's first component), the byte range and the problem.
Result<json> DamagedFiles(Store& store, const VerifyReport& report) {
  json out = json::array();
  if (report.damaged.empty()) return out;
  std::unordered_map<ChunkId, const std::string*> bad;
  for (const auto& [id, problem] : report.damaged) bad.emplace(id, &problem);
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store.catalog().BeginRead());
  std::vector<FileInfo> files;
  CKPTFS_RETURN_IF_ERROR(WalkTree(txn, kRootIno, "", &files));
  for (const FileInfo& f : files) {
    if (!f.inode.is_reg() || f.inode.content == 0) continue;
    const std::string version = f.path.substr(0, f.path.find('/'));
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(f.inode.content, 0, [&](const ChunkRef& ref) {
      auto it = bad.find(ref.id);
      if (it != bad.end()) {
        out.push_back({{"version", version},
                       {"file", f.path},
                       {"offset", ref.offset},
                       {"length", ref.length},
                       {"problem", *it->second}});
      }
      return true;
    }));
  }
  return out;
}

}  // namespace

namespace {

Result<json> RunAdminRequest(Store* store, FileSystem* fs, const json& request,
                             const ProgressFn& progress) {
  if (!request.is_object() || !request.contains("cmd") || !request["cmd"].is_string()) {
    return Status::InvalidArgument("an admin request needs cmd");
  }
  const std::string cmd = request["cmd"].get<std::string>();
  if (cmd == "log") return Log(store, request);
  if (cmd == "files") return Files(store, request);
  if (cmd == "diff") return Diff(store, request);
  if (cmd == "forget_plan") return ForgetPlan(store, request);
  if (cmd == "save_cost") return SaveCost(store, request);
  if (cmd == "stats") {
    CKPTFS_ASSIGN_OR_RETURN(StoreStats st, store->Stats());
    json out = StatsOf(*store, st);
    out["daemon"] = nullptr;
    if (fs != nullptr) {  // served by a mount: what the daemon counted since it started
      const FsMetrics& m = fs->metrics();
      const FileSystem::Backlog backlog = fs->WriteBacklog();
      json cpu = json::object();
      for (const auto& [role, seconds] : CpuByRole()) cpu[role] = seconds;
      out["daemon"] = {{"pid", ::getpid()},
                       {"uptime_seconds", ProcessUptimeSeconds()},
                       {"bytes_written", m.bytes_written.load()},
                       {"bytes_read", m.bytes_read.load()},
                       {"latency",
                        {{"read", LatencyOf(m.read)},
                         {"write", LatencyOf(m.write)},
                         {"fsync", LatencyOf(m.fsync)}}},
                       {"cpu_seconds", cpu},
                       {"queued_commits", backlog.queued_commits},
                       {"pending_bytes", backlog.pending_bytes},
                       {"journaled_files", backlog.journaled_files},
                       {"journaled_bytes", backlog.journaled_bytes},
                       {"view_inodes", fs->ViewNodes()}};
    }
    return out;
  }
  if (cmd == "verify") {
    CKPTFS_ASSIGN_OR_RETURN(VerifyReport r, store->Verify(progress));
    {  // Files whose size is not their content's (CheckFileSize).
      // A damaged namespace row (Corruption) is a problem to report, not the end of verify.
      CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
      auto versions = ListVersions(txn);
      if (!versions.ok()) r.problems.push_back(versions.status().message());
      for (const auto& v : versions.ok() ? *versions : std::vector<Version>()) {
        std::vector<FileInfo> files;
        if (Status s = VersionTree(txn, v, &files); !s.ok()) {
          r.problems.push_back(v.name + ": " + s.message());
          continue;
        }
        for (const auto& f : files) {
          Status s = CheckFileSize(txn, v.name + "/" + f.path, f.inode);
          if (!s.ok()) r.problems.push_back(s.message());
        }
      }
    }
    auto named = DamagedFiles(*store, r);
    if (!named.ok()) r.problems.push_back(named.status().message());
    json damaged = named.ok() ? *named : json::array();
    return json{{"chunks_checked", r.chunks_checked},
                {"contents_checked", r.contents_checked},
                {"problems", r.problems},
                {"damaged", damaged},
                {"ok", r.ok()}};
  }
  if (cmd == "gc") {
    GcOptions options;
    options.progress = progress;
    if (request.contains("rewrite_below") && request["rewrite_below"].is_number()) {
      options.rewrite_below = request["rewrite_below"].get<double>();
    }
    if (fs != nullptr) {
      // Pending commits finish first; one that failed (typically for lack of space, which is
      // why gc runs now) must not keep gc from freeing space.
      (void)fs->Sync();
    }
    CKPTFS_ASSIGN_OR_RETURN(GcReport r, store->Gc(options));
    return json{{"chunks_dropped", r.chunks_dropped},
                {"deltas_rematerialized", r.deltas_rematerialized},
                {"records_moved", r.records_moved},
                {"packs_deleted", r.packs_deleted},
                {"pack_bytes_punched", r.pack_bytes_punched},
                {"pack_bytes_before", r.pack_bytes_before},
                {"pack_bytes_after", r.pack_bytes_after},
                {"skipped", r.skipped}};
  }
  if (cmd == "status") {
    const StoreOptions& o = store->options();
    json queued, pending, journaled;  // null offline: no write queue without a daemon
    if (fs != nullptr) {
      const FileSystem::Backlog backlog = fs->WriteBacklog();
      queued = backlog.queued_commits;
      pending = backlog.pending_bytes;
      journaled = backlog.journaled_bytes;
    }
    return json{{"pid", ::getpid()},
                {"store", store->dir().string()},
                {"uptime_seconds", ProcessUptimeSeconds()},
                {"codec", o.codec ? o.codec->ToString() : CodecSpec{}.ToString()},
                {"cache_bytes", o.cache_bytes},
                {"inflight_bytes", o.inflight_bytes},
                {"inflight_peak_bytes", store->inflight_peak_bytes()},
                {"delta_chain", o.max_delta_chain},
                {"pack_read_bytes", store->pack_read_bytes()},
                {"pack_reads", store->pack_reads()},
                {"queued_commits", queued},
                {"pending_bytes", pending},
                {"journaled_bytes", journaled}};
  }
  if (cmd == "remove_version") {
    if (fs == nullptr) return Status::InvalidArgument("remove_version needs the namespace");
    const std::string name = request.value("name", "");
    {
      CKPTFS_ASSIGN_OR_RETURN(auto txn, store->catalog().BeginRead());
      CKPTFS_RETURN_IF_ERROR(FindVersion(txn, name).status());
    }
    // A file version is removed from its directory (the path's last component).
    Ino parent = kRootIno;
    size_t begin = 0;
    for (size_t slash; (slash = name.find('/', begin)) != std::string::npos; begin = slash + 1) {
      CKPTFS_ASSIGN_OR_RETURN(Inode dir, fs->Lookup(parent, name.substr(begin, slash - begin)));
      parent = dir.ino;
    }
    CKPTFS_RETURN_IF_ERROR(RemoveTree(fs, parent, name.substr(begin)));
    return json{{"removed", name}, {"parent", parent}, {"entry", name.substr(begin)}};
  }
  return Status::InvalidArgument("unknown admin request '" + cmd + "'");
}

}  // namespace

Result<json> RunAdmin(Store* store, FileSystem* fs, const json& request,
                      const ProgressFn& progress) {
  // A field of the wrong type ({"version": 5}) makes json::value() throw: an error for the
  // caller, never an exception out of the daemon's connection thread.
  try {
    return RunAdminRequest(store, fs, request, progress);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("malformed admin request: ") + e.what());
  }
}

}  // namespace ckptfs
