#include "engine/objstore/bucket_mirror.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "engine/objstore/remote_packs.h"
#include "engine/objstore/remote_versions.h"
#include "engine/objstore/sigv4.h"
#include "engine/store/catalog.h"
#include "engine/store/record.h"
#include "engine/store/store.h"
#include "engine/util/buffer.h"
#include "engine/util/file.h"

namespace ckptfs::objstore {
namespace {

namespace fs = std::filesystem;
constexpr int kManifestFormat = 1;
constexpr const char* kImageDir = "publish-image";
// Segments moved at the same time (each holds one segment in memory).
constexpr size_t kTransfers = 4;
// How often the active pack is checked for whole segments to upload ahead of a publication.
constexpr auto kAheadInterval = std::chrono::milliseconds(50);
// Catalog images a publication takes at most while records it uploads keep being punched.
constexpr int kMaxImageRounds = 8;

std::string ObjectKey(const S3Location& loc, const std::string& sha256) {
  return loc.Key("objects/" + sha256);
}

std::string ManifestPrefix(const S3Location& loc, const std::string& node) {
  return loc.Key("nodes/" + node + "/manifests/");
}

// Pack file name -> committed length, from a catalog.
Result<std::map<std::string, uint64_t>> CommittedLengths(const Catalog& catalog) {
  std::map<std::string, uint64_t> out;
  CKPTFS_ASSIGN_OR_RETURN(Catalog::ReadTxn txn, catalog.BeginRead());
  CKPTFS_RETURN_IF_ERROR(txn.ForEachPack([&](uint32_t id, const PackRow& row) {
    out[PackFileName(id)] = row.committed;
    return true;
  }));
  return out;
}

Status WriteFileAt(int fd, Bytes data, uint64_t offset, const std::string& what) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "write " + what);
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

// A blob named by its SHA-256, checked against its name (once: the client compares it with the
// stored checksum too).
Result<Buffer> GetBlob(S3Client& s3, const S3Location& loc, const std::string& sha256) {
  return s3.Get(loc.bucket, ObjectKey(loc, sha256), sha256);
}

Result<std::optional<std::string>> NewestManifestKey(S3Client& s3, const S3Location& loc,
                                                     const std::string& node) {
  CKPTFS_ASSIGN_OR_RETURN(std::vector<ObjectEntry> all,
                          s3.List(loc.bucket, ManifestPrefix(loc, node)));
  if (all.empty()) return std::optional<std::string>();
  return std::optional<std::string>(all.back().key);  // zero-padded: the last sorts newest
}

Result<nlohmann::json> ReadManifest(S3Client& s3, const S3Location& loc, const std::string& key) {
  CKPTFS_ASSIGN_OR_RETURN(Buffer raw, s3.Get(loc.bucket, key));
  nlohmann::json doc = nlohmann::json::parse(AsChars(raw.bytes()), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.value("format", 0) != kManifestFormat ||
      !doc.contains("catalog") || !doc.contains("packs") || !doc["packs"].is_object()) {
    return Status::Corruption("manifest s3://" + loc.bucket + "/" + key +
                              " is not one this ckptfs reads");
  }
  return doc;
}

// What manifest `key` (parsed) names.
Result<BucketMirror::Publication> ParsePublication(const nlohmann::json& manifest,
                                                   const std::string& key) {
  BucketMirror::Publication pub;
  pub.seq = manifest.value("seq", uint64_t{0});
  pub.image_sha256 = manifest["catalog"].value("sha256", "");
  for (const auto& [file, segments] : manifest["packs"].items()) {
    std::vector<PackSegment>& segs = pub.packs[file];
    for (const auto& seg : segments) {
      if (!seg.is_array() || seg.size() != 3 || !seg[0].is_number_unsigned() ||
          !seg[1].is_number_unsigned() || !seg[2].is_string()) {
        return Status::Corruption("manifest " + key + " has a malformed segment");
      }
      segs.push_back({seg[0].get<uint64_t>(), seg[1].get<uint64_t>(), seg[2].get<std::string>()});
    }
  }
  return pub;
}

// The newest publication of `node` (seq 0 and nothing else when it published none).
Result<BucketMirror::Publication> NewestPublication(S3Client& s3, const S3Location& loc,
                                                    const std::string& node) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> key, NewestManifestKey(s3, loc, node));
  if (!key) return BucketMirror::Publication();
  CKPTFS_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(s3, loc, *key));
  return ParsePublication(manifest, *key);
}

// Writes `data` as the new file `path`, not synced (SettleRestore syncs it).
Status WriteCacheFile(const fs::path& path, Bytes data) {
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd,
                          OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC));
  return WriteFileAt(fd.get(), data, 0, path.string());
}

// Makes a cache directory ready for a restore, durably marked as one in progress: a previous
// attempt's files removed, the directories made, kRestoreMarker created and synced.
Status PrepareRestore(const fs::path& cache_dir) {
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) return Status::FromErrno(ec.value(), "create " + cache_dir.string());
  const fs::path marker = cache_dir / BucketMirror::kRestoreMarker;
  {
    CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(marker, O_WRONLY | O_CREAT | O_CLOEXEC));
    CKPTFS_RETURN_IF_ERROR(DataSync(fd.get(), marker));
  }
  CKPTFS_RETURN_IF_ERROR(SyncDir(cache_dir));
  // The marker is durable: what follows may be torn by a crash, and is then redone.
  fs::remove(cache_dir / "ckptfs.json", ec);
  fs::remove_all(cache_dir / "catalog", ec);
  fs::remove_all(cache_dir / "packs", ec);
  fs::remove(cache_dir / RemotePacks::kFileName, ec);
  fs::create_directories(cache_dir / "catalog", ec);
  fs::create_directories(cache_dir / "packs", ec);
  if (ec) return Status::FromErrno(ec.value(), "create " + cache_dir.string());
  return Status::OK();
}

// Runs fn(0) ... fn(n - 1) on up to kTransfers threads; returns the first error (the other
// tasks still run to their end).
Status RunParallel(size_t n, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  Mutex mu;
  Status first;
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      Status st = fn(i);
      if (!st.ok()) {
        MutexLock lock(mu);
        if (first.ok()) first = st;
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min<size_t>(n, kTransfers); ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  MutexLock lock(mu);
  return first;
}

}  // namespace

std::string BucketMirror::ManifestKey(const S3Location& loc, const std::string& node,
                                      uint64_t seq) {
  char num[24];
  std::snprintf(num, sizeof(num), "%020" PRIu64, seq);
  return ManifestPrefix(loc, node) + num;
}

Result<BucketMirror::Publication> BucketMirror::ReadPublication(S3Client& s3, const S3Location& loc,
                                                                const std::string& node,
                                                                uint64_t seq) {
  const std::string key = ManifestKey(loc, node, seq);
  CKPTFS_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(s3, loc, key));
  return ParsePublication(manifest, key);
}

Result<Buffer> BucketMirror::GetObject(S3Client& s3, const S3Location& loc,
                                       const std::string& sha256) {
  return GetBlob(s3, loc, sha256);
}

Status BucketMirror::InitBucket(S3Client& s3, const S3Location& loc, const fs::path& local_store) {
  CKPTFS_RETURN_IF_ERROR(s3.CreateBucket(loc.bucket));
  Result<ObjectInfo> existing = s3.Head(loc.bucket, loc.Key("ckptfs.json"));
  if (existing.ok()) {
    return Status::AlreadyExists("there is a ckptfs store at " + loc.ToString() + " already");
  }
  if (!existing.status().IsNotFound()) return existing.status();
  std::ifstream in(local_store / "ckptfs.json", std::ios::binary);
  std::string params((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (params.empty()) return Status::IOError("no ckptfs.json in " + local_store.string());
  return s3.Put(loc.bucket, loc.Key("ckptfs.json"), AsBytes(params));
}

Result<std::optional<BucketMirror::Publication>> BucketMirror::Restore(S3Client& s3,
                                                                       const S3Location& loc,
                                                                       const std::string& node,
                                                                       const fs::path& cache_dir) {
  std::error_code ec;
  if (fs::exists(cache_dir / "ckptfs.json", ec) && !fs::exists(cache_dir / kRestoreMarker, ec)) {
    return std::optional<Publication>();  // a store is there
  }
  // Three things at once (each a round trip, or a few syncs): the cache directory made ready
  // and marked, the store's parameters, and the node's newest manifest.
  auto prepared = std::async(std::launch::async, [&] { return PrepareRestore(cache_dir); });
  auto newest_async =
      std::async(std::launch::async, [&] { return NewestPublication(s3, loc, node); });
  Result<Buffer> params = s3.Get(loc.bucket, loc.Key("ckptfs.json"));
  Result<Publication> newest = newest_async.get();
  CKPTFS_RETURN_IF_ERROR(prepared.get());
  if (!params.ok() && params.status().IsNotFound()) {
    return Status::NotFound("no ckptfs store at " + loc.ToString() +
                            ": create one with "
                            "`ckptfs init " +
                            loc.ToString() + " --endpoint URL`");
  }
  if (!params.ok()) return params.status();
  if (!newest.ok()) return newest.status();

  // Nothing below is synced: the bucket holds all of it, so losing it costs a download, never
  // data. The marker, durable since PrepareRestore, says so until SettleRestore has synced it.
  if (newest->seq > 0) {
    CKPTFS_ASSIGN_OR_RETURN(Buffer image, GetBlob(s3, loc, newest->image_sha256));
    CKPTFS_RETURN_IF_ERROR(WriteCacheFile(cache_dir / "catalog" / "data.mdb", image.bytes()));
    // Reads on demand: each pack becomes a sparse file of its published length (what the
    // store's recovery and pack writer expect), its records read from the bucket's segments
    // when they are needed (remote_packs.h); remote-packs.json says which.
    uint64_t bytes = 0;
    for (const auto& [file, segs] : newest->packs) {
      uint32_t pack_id = 0;
      if (!ParsePackFileName(file, &pack_id)) {
        return Status::Corruption("manifest " + ManifestKey(loc, node, newest->seq) +
                                  " names a pack '" + file + "'");
      }
      const uint64_t length = segs.empty() ? 0 : segs.back().offset + segs.back().length;
      bytes += length;
      const fs::path path = cache_dir / "packs" / file;
      CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd,
                              OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC));
      if (::ftruncate(fd.get(), static_cast<off_t>(length)) != 0) {
        return Status::FromErrno(errno, "truncate " + path.string());
      }
    }
    CKPTFS_RETURN_IF_ERROR(RemotePacks::Record(cache_dir, newest->packs, /*sync=*/false));
    spdlog::info(
        "restored {} from {}: catalog {} bytes; {} pack bytes in {} packs read from "
        "the bucket on demand",
        cache_dir.string(), ManifestKey(loc, node, newest->seq), image.size(), bytes,
        newest->packs.size());
  }
  CKPTFS_RETURN_IF_ERROR(WriteCacheFile(cache_dir / "ckptfs.json", params->bytes()));
  return std::optional<Publication>(std::move(*newest));
}

Status BucketMirror::SettleRestore(const fs::path& cache_dir) {
  const fs::path marker = cache_dir / kRestoreMarker;
  std::error_code ec;
  if (!fs::exists(marker, ec)) return Status::OK();
  auto sync_file = [](const fs::path& path) -> Status {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return Status::OK();  // gone since (the store's gc)
    if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
    Status st = DataSync(fd, path);
    ::close(fd);
    return st;
  };
  CKPTFS_RETURN_IF_ERROR(sync_file(cache_dir / "catalog" / "data.mdb"));
  for (const auto& entry : fs::directory_iterator(cache_dir / "packs", ec)) {
    CKPTFS_RETURN_IF_ERROR(sync_file(entry.path()));
  }
  if (ec) return Status::FromErrno(ec.value(), "list " + (cache_dir / "packs").string());
  CKPTFS_RETURN_IF_ERROR(sync_file(cache_dir / RemotePacks::kFileName));
  CKPTFS_RETURN_IF_ERROR(sync_file(cache_dir / "ckptfs.json"));
  CKPTFS_RETURN_IF_ERROR(SyncDir(cache_dir / "packs"));
  CKPTFS_RETURN_IF_ERROR(SyncDir(cache_dir / "catalog"));
  CKPTFS_RETURN_IF_ERROR(SyncDir(cache_dir));
  if (::unlink(marker.c_str()) != 0) return Status::FromErrno(errno, "remove " + marker.string());
  return SyncDir(cache_dir);
}

BucketMirror::BucketMirror(S3Client* s3, S3Location loc, std::string node, Store* store,
                           const RemotePacks* remote, uint64_t segment_bytes)
    : s3_(s3),
      loc_(std::move(loc)),
      node_(std::move(node)),
      store_(store),
      remote_(remote),
      segment_bytes_(segment_bytes) {}

uint64_t BucketMirror::published_seq() {
  MutexLock run(run_mu_);
  return seq_;
}

Result<std::unique_ptr<BucketMirror>> BucketMirror::Open(S3Client* s3, S3Location loc,
                                                         std::string node, Store* store,
                                                         const RemotePacks* remote,
                                                         std::optional<Publication> newest,
                                                         uint64_t segment_bytes) {
  std::unique_ptr<BucketMirror> m(
      new BucketMirror(s3, std::move(loc), std::move(node), store, remote, segment_bytes));
  MutexLock run(m->run_mu_);
  if (!newest) {
    CKPTFS_ASSIGN_OR_RETURN(newest, NewestPublication(*s3, m->loc_, m->node_));
  }
  m->ahead_thread_ = std::thread([p = m.get()] {
    for (;;) {
      {
        MutexLock lock(p->mu_);
        if (!p->stopping_) p->stop_cv_.WaitFor(lock, kAheadInterval);
        if (p->stopping_) return;
      }
      // Again at once while it finds whole segments (the pack fills while one uploads).
      MutexLock run(p->run_mu_);
      while (p->UploadAhead()) {
        MutexLock lock(p->mu_);
        if (p->stopping_) return;
      }
    }
  });
  if (newest->seq == 0) return m;
  m->seq_ = newest->seq;
  m->last_image_ = newest->image_sha256;
  for (auto& [file, segs] : newest->packs) {
    // A local pack shorter than what the bucket holds is not the one published (the cache
    // belongs to another store or was cut): publish it anew (identical segments dedup).
    std::error_code ec;
    uint64_t local = fs::file_size(store->dir() / "packs" / file, ec);
    uint64_t have = segs.empty() ? 0 : segs.back().offset + segs.back().length;
    if (!ec && local >= have) m->packs_[file] = std::move(segs);
  }
  return m;
}

BucketMirror::~BucketMirror() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stop_cv_.NotifyAll();
  if (ahead_thread_.joinable()) ahead_thread_.join();
}

MirrorStats BucketMirror::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

Status BucketMirror::Publish() {
  uint64_t ticket = 0;
  {
    MutexLock lock(mu_);
    ticket = ++requested_;
  }
  MutexLock run(run_mu_);
  uint64_t covering = 0;
  {
    MutexLock lock(mu_);
    if (covered_ >= ticket) return Status::OK();  // a publication that began later covered it
    covering = requested_;
  }
  Status st = PublishNow();
  MutexLock lock(mu_);
  if (st.ok()) covered_ = covering;
  return st;
}

Status BucketMirror::PublishNow() {
  // Pack bytes first, up to what the live catalog has committed (synced before their commit);
  // then a catalog image, whose own committed lengths may be a little further (contents that
  // committed meanwhile): those bytes too. Then the image, then the manifest.
  //
  // The re-encoder punches records out of packs once no row points at them. A record read
  // before the image was taken is safe: punched by then, it was dead before the image. One
  // read after it may have been punched in between while the image still names it; punches
  // are never undone, so a range with no hole after its upload had none during it. If a range
  // uploaded after the image has a hole, a new image (which no longer names what was punched
  // before it) is taken and checked the same way. A punch to the byte zeroes the partial
  // blocks at a dead range's edges in place, which leaves no hole: the store's log of punches
  // (Store::PunchedSince) says whether one since the image touched a range uploaded after it.
  CKPTFS_ASSIGN_OR_RETURN(auto live, CommittedLengths(store_->catalog()));
  CKPTFS_RETURN_IF_ERROR(UploadPacks(live, nullptr));

  fs::path image_dir = store_->dir() / kImageDir;
  std::error_code ec;
  std::map<std::string, uint64_t> lengths;  // pack file -> committed length, in the image
  for (int round = 1;; ++round) {
    const uint64_t punch_seq = store_->PunchSeq();  // punches after it may hit what the image names
    fs::remove_all(image_dir, ec);
    fs::create_directories(image_dir, ec);
    if (ec) return Status::FromErrno(ec.value(), "create " + image_dir.string());
    CKPTFS_RETURN_IF_ERROR(store_->catalog().CopyTo(image_dir));
    {
      CKPTFS_ASSIGN_OR_RETURN(auto image_catalog, Catalog::Open(image_dir));
      CKPTFS_ASSIGN_OR_RETURN(lengths, CommittedLengths(*image_catalog));
    }
    std::vector<Range> after;
    CKPTFS_RETURN_IF_ERROR(UploadPacks(lengths, &after));
    CKPTFS_ASSIGN_OR_RETURN(bool punched, AnyHole(after));
    for (const Range& r : after) {
      uint32_t pack_id = 0;
      if (!punched && ParsePackFileName(r.file, &pack_id) &&
          store_->PunchedSince(punch_seq, pack_id, r.offset, r.offset + r.length)) {
        punched = true;
      }
    }
    if (!punched) break;
    if (round == kMaxImageRounds) {
      return Status::Busy("publishing " + loc_.ToString() + ": records were punched while " +
                          "they uploaded, " + std::to_string(round) + " times; try again");
    }
    spdlog::info("publishing {}: a record was punched while it uploaded; a new catalog image",
                 loc_.ToString());
  }

  fs::path image = image_dir / "data.mdb";
  std::ifstream in(image, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) return Status::IOError("empty catalog image " + image.string());
  std::string image_sha = Sha256Hex(AsBytes(bytes));
  if (image_sha == last_image_ && !uploaded_since_) {  // nothing new since the last manifest
    fs::remove_all(image_dir, ec);
    return Status::OK();
  }
  CKPTFS_RETURN_IF_ERROR(
      s3_->Put(loc_.bucket, ObjectKey(loc_, image_sha), AsBytes(bytes), image_sha));
  fs::remove_all(image_dir, ec);

  nlohmann::json packs = nlohmann::json::object();
  for (const auto& [file, length] : lengths) {
    nlohmann::json segs = nlohmann::json::array();
    for (const Segment& s : packs_[file]) segs.push_back({s.offset, s.length, s.sha256});
    packs[file] = std::move(segs);
  }
  nlohmann::json manifest = {{"format", kManifestFormat},
                             {"node", node_},
                             {"seq", seq_ + 1},
                             {"unix_time", static_cast<int64_t>(::time(nullptr))},
                             {"catalog", {{"sha256", image_sha}, {"bytes", bytes.size()}}},
                             {"packs", std::move(packs)}};
  std::string text = manifest.dump();
  CKPTFS_RETURN_IF_ERROR(s3_->Put(loc_.bucket, ManifestKey(loc_, node_, seq_ + 1), AsBytes(text)));
  ++seq_;
  last_image_ = image_sha;
  uploaded_since_ = false;
  MutexLock lock(mu_);
  stats_.catalog_bytes_uploaded += bytes.size();
  ++stats_.publications;
  return Status::OK();
}

Status BucketMirror::UploadPacks(const std::map<std::string, uint64_t>& lengths,
                                 std::vector<Range>* uploaded) {
  std::vector<Range> tasks;
  for (const auto& [file, length] : lengths) {
    uint32_t pack_id = 0;
    if (remote_ && packs_[file].empty() && ParsePackFileName(file, &pack_id)) {
      // A pack of another node's (an imported version's records): its segments are in the
      // bucket; a manifest names them (which keeps them from gc), and only bytes this node
      // appended past them are uploaded.
      std::vector<Segment> theirs = remote_->Segments(pack_id);
      if (!theirs.empty()) {
        packs_[file] = std::move(theirs);
        uploaded_since_ = true;
      }
    }
    std::vector<Segment>& segs = packs_[file];
    uint64_t have = segs.empty() ? 0 : segs.back().offset + segs.back().length;
    // Segments uploaded ahead that this length covers whole are named as they are.
    std::vector<Segment>& ahead = ahead_[file];
    size_t taken = 0;
    for (; taken < ahead.size() && ahead[taken].offset == have &&
           ahead[taken].offset + ahead[taken].length <= length;
         ++taken) {
      segs.push_back(ahead[taken]);
      have += ahead[taken].length;
      uploaded_since_ = true;
    }
    ahead.erase(ahead.begin(), ahead.begin() + static_cast<std::ptrdiff_t>(taken));
    // One that reaches past it is superseded by the segment uploaded below (and left to gc).
    if (have < length) ahead.clear();
    for (uint64_t off = have; off < length; off += segment_bytes_) {
      tasks.push_back({file, off, std::min(segment_bytes_, length - off)});
    }
  }
  std::vector<Segment> done(tasks.size());
  std::vector<char> gone(tasks.size(), 0);  // the pack file was deleted (by the store's gc)
  CKPTFS_RETURN_IF_ERROR(RunParallel(tasks.size(), [&](size_t i) -> Status {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<Segment> seg,
                            UploadSegment(tasks[i].file, tasks[i].offset, tasks[i].length));
    if (seg) {
      done[i] = std::move(*seg);
    } else {
      gone[i] = 1;
    }
    return Status::OK();
  }));
  // Only once all are up: the segments of a pack stay contiguous from its start. A deleted
  // pack gets none: the store's gc moved its records and committed before deleting it, so a
  // catalog image taken after the deletion does not name it (an earlier one is retaken).
  std::set<std::string> deleted;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (gone[i]) deleted.insert(tasks[i].file);
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (deleted.count(tasks[i].file) == 0) packs_[tasks[i].file].push_back(std::move(done[i]));
  }
  if (!tasks.empty()) uploaded_since_ = true;
  if (uploaded) *uploaded = std::move(tasks);
  return Status::OK();
}

bool BucketMirror::UploadAhead() {
  // The packs the store appends to (one per lane, pack_writer.h).
  bool uploaded = false;
  for (const PackExtent& pack : store_->ActivePacks()) {
    if (UploadAheadOf(pack.pack_id)) uploaded = true;
  }
  return uploaded;
}

bool BucketMirror::UploadAheadOf(uint32_t active) {
  std::error_code ec;
  if (remote_ && !remote_->Segments(active).empty()) return false;
  const std::string file = PackFileName(active);
  const std::vector<Segment>& segs = packs_[file];
  std::vector<Segment>& ahead = ahead_[file];
  uint64_t end = !ahead.empty() ? ahead.back().offset + ahead.back().length
                 : segs.empty() ? 0
                                : segs.back().offset + segs.back().length;
  const uint64_t size = fs::file_size(store_->dir() / "packs" / file, ec);
  if (ec || size < end + segment_bytes_) return false;
  // Committed bytes are whole records; past them, each record is checked.
  uint64_t& written = written_[file];
  {
    Result<std::map<std::string, uint64_t>> committed = CommittedLengths(store_->catalog());
    if (committed.ok()) written = std::max(written, (*committed)[file]);
  }
  written = std::max<uint64_t>(written, kPackHeaderBytes);
  written = WrittenEnd(file, written);
  std::vector<Range> tasks;
  for (uint64_t off = end; off + segment_bytes_ <= written; off += segment_bytes_) {
    tasks.push_back({file, off, segment_bytes_});
  }
  if (tasks.empty()) return false;
  std::vector<std::optional<Segment>> done(tasks.size());
  Status st = RunParallel(tasks.size(), [&](size_t i) -> Status {
    CKPTFS_ASSIGN_OR_RETURN(done[i], UploadSegment(file, tasks[i].offset, tasks[i].length));
    return Status::OK();
  });
  if (!st.ok()) {
    spdlog::warn("uploading ahead to {}: {} (the next publication uploads it)", loc_.ToString(),
                 st.ToString());
  }
  for (std::optional<Segment>& seg : done) {  // the uploaded prefix only: contiguous
    if (!seg) return false;
    ahead.push_back(std::move(*seg));
  }
  return st.ok();
}

uint64_t BucketMirror::WrittenEnd(const std::string& file, uint64_t from) const {
  const fs::path path = store_->dir() / "packs" / file;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return from;
  uint64_t pos = from;
  Buffer payload;
  for (;;) {
    std::byte header_bytes[kRecordHeaderBytes];
    if (::pread(fd, header_bytes, kRecordHeaderBytes, static_cast<off_t>(pos)) !=
        static_cast<ssize_t>(kRecordHeaderBytes)) {
      break;
    }
    Result<RecordHeader> header = RecordHeader::Decode(Bytes(header_bytes, kRecordHeaderBytes));
    if (!header.ok()) break;  // not written yet (or punched): stop here
    payload.Resize(header->stored_len);
    if (::pread(fd, payload.data(), payload.size(), static_cast<off_t>(pos + kRecordHeaderBytes)) !=
            static_cast<ssize_t>(payload.size()) ||
        Checksum64(payload.bytes()) != header->payload_checksum) {
      break;
    }
    pos += kRecordHeaderBytes + header->stored_len;
  }
  ::close(fd);
  return pos;
}

Result<bool> BucketMirror::AnyHole(const std::vector<Range>& ranges) const {
  for (const Range& r : ranges) {
    fs::path path = store_->dir() / "packs" / r.file;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return true;  // deleted since: retake the image
    if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
    off_t hole = ::lseek(fd, static_cast<off_t>(r.offset), SEEK_HOLE);
    int err = errno;
    ::close(fd);
    // ENXIO: the offset is past the end (the file was cut); other errors: no SEEK_HOLE, so no
    // punching either (gc and the re-encoder need the same support).
    if (hole < 0 && err == ENXIO) return true;
    if (hole >= 0 && static_cast<uint64_t>(hole) < r.offset + r.length) return true;
  }
  return false;
}

Result<std::optional<BucketMirror::Segment>> BucketMirror::UploadSegment(const std::string& file,
                                                                         uint64_t offset,
                                                                         uint64_t length) {
  fs::path path = store_->dir() / "packs" / file;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return std::optional<Segment>();
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  Buffer buf(static_cast<size_t>(length));
  size_t done = 0;
  Status st;
  while (done < length) {
    ssize_t n = ::pread(fd, buf.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      st = n < 0 ? Status::FromErrno(errno, "read " + path.string())
                 : Status::IOError(path.string() + " is shorter than its committed length");
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  CKPTFS_RETURN_IF_ERROR(st);
  std::string sha = Sha256Hex(buf.bytes());
  std::string key = ObjectKey(loc_, sha);
  Result<ObjectInfo> there = s3_->Head(loc_.bucket, key);
  bool dedup = there.ok() && there->size == length;
  if (!dedup) {
    if (!there.ok() && !there.status().IsNotFound()) return there.status();
    CKPTFS_RETURN_IF_ERROR(s3_->Put(loc_.bucket, key, buf.bytes(), sha));
  }
  MutexLock lock(mu_);
  if (dedup) {
    ++stats_.segments_deduplicated;
  } else {
    ++stats_.segments_uploaded;
    stats_.segment_bytes_uploaded += length;
  }
  return std::optional<Segment>(Segment{offset, length, sha});
}

Result<BucketGcReport> BucketMirror::CollectGarbage(S3Client& s3, const S3Location& loc,
                                                    const BucketGcOptions& options) {
  BucketGcReport report;
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  const int64_t cutoff = now - static_cast<int64_t>(options.grace.count());
  const size_t keep = static_cast<size_t>(std::max(1, options.keep_manifests));

  // Mark: the manifests kept, newest first per node, and the objects they name.
  CKPTFS_ASSIGN_OR_RETURN(std::vector<ObjectEntry> manifests,
                          s3.List(loc.bucket, loc.Key("nodes/")));
  std::map<std::string, std::vector<ObjectEntry>> by_node;  // "nodes/<node>/manifests/"
  for (ObjectEntry& m : manifests) {
    size_t cut = m.key.rfind('/');
    if (cut == std::string::npos || m.key.find("/manifests/") == std::string::npos) continue;
    by_node[m.key.substr(0, cut)].push_back(std::move(m));
  }
  // Manifests a version part names (remote_versions.h): what a mount adding that version
  // reads, kept however old.
  std::set<std::string> pinned;
  CKPTFS_ASSIGN_OR_RETURN(std::vector<VersionPart> parts, RemoteVersions::ListParts(s3, loc));
  for (const VersionPart& p : parts) pinned.insert(ManifestKey(loc, p.node, p.seq));
  std::set<std::string> live;  // object keys
  std::vector<ObjectEntry> doomed_manifests;
  for (auto& [node, list] : by_node) {
    std::sort(list.begin(), list.end(),
              [](const ObjectEntry& a, const ObjectEntry& b) { return a.key > b.key; });
    for (size_t i = 0; i < list.size(); ++i) {
      if (i >= keep && list[i].last_modified <= cutoff && pinned.count(list[i].key) == 0) {
        doomed_manifests.push_back(list[i]);
        continue;
      }
      Result<nlohmann::json> doc = ReadManifest(s3, loc, list[i].key);
      if (!doc.ok() && doc.status().IsNotFound()) continue;  // another gc took it
      if (!doc.ok()) return doc.status();
      live.insert(ObjectKey(loc, (*doc)["catalog"]["sha256"].get<std::string>()));
      for (const auto& [file, segments] : (*doc)["packs"].items()) {
        for (const auto& seg : segments) live.insert(ObjectKey(loc, seg.at(2).get<std::string>()));
      }
    }
  }
  // Sweep: superseded manifests first (nothing reads them), then the objects nothing names.
  for (const ObjectEntry& m : doomed_manifests) {
    CKPTFS_RETURN_IF_ERROR(s3.Delete(loc.bucket, m.key));
    ++report.manifests_deleted;
  }
  CKPTFS_ASSIGN_OR_RETURN(std::vector<ObjectEntry> objects,
                          s3.List(loc.bucket, loc.Key("objects/")));
  for (const ObjectEntry& o : objects) {
    if (live.count(o.key) > 0 || o.last_modified > cutoff) {
      ++report.objects_kept;
      continue;
    }
    CKPTFS_RETURN_IF_ERROR(s3.Delete(loc.bucket, o.key));
    ++report.objects_deleted;
    report.bytes_deleted += o.size;
  }
  CKPTFS_ASSIGN_OR_RETURN(std::vector<UploadEntry> uploads,
                          s3.ListUploads(loc.bucket, loc.prefix.empty() ? "" : loc.prefix + "/"));
  for (const UploadEntry& u : uploads) {
    if (u.initiated > cutoff) continue;
    CKPTFS_RETURN_IF_ERROR(s3.AbortUpload(loc.bucket, u.key, u.upload_id));
    ++report.uploads_aborted;
  }
  return report;
}

}  // namespace ckptfs::objstore
