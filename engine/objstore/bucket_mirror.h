// engine/objstore/bucket_mirror.h
//
// Makes a node's local store durable in an S3 bucket, and brings it back from there into an
// empty cache directory (docs/scale-out.md):
//
//   PREFIX/ckptfs.json                    the store's parameters (InitBucket)
//   PREFIX/objects/<sha256>               immutable blobs named by their SHA-256: pack segments
//                                         (<= segment_bytes of a pack file, 8 MiB by default)
//                                         and catalog images
//   PREFIX/nodes/<node>/manifests/<seq>   one publication: the catalog image and, per pack
//                                         file, the segments that make it up
//
//   CKPTFS_ASSIGN_OR_RETURN(auto newest, BucketMirror::Restore(s3, loc, "node1", cache_dir));
//   CKPTFS_ASSIGN_OR_RETURN(options.remote_records, RemotePacks::Open(&s3, loc, cache_dir));
//   auto store = Store::Open(cache_dir, options);
//   CKPTFS_ASSIGN_OR_RETURN(auto mirror, BucketMirror::Open(&s3, loc, "node1", store.get(),
//                                                           remote.get(), std::move(newest)));
//   std::thread settle([&] { (void)BucketMirror::SettleRestore(cache_dir); });  // serving now
//   CKPTFS_RETURN_IF_ERROR(mirror->Publish());   // after the store made its data durable
//
// Guarantees:
// - Publish() returns once every content committed in the store before the call is in the
//   bucket: the pack bytes its catalog image references (up to each pack's committed length,
//   which the store synced before committing), the image itself, and then the manifest that
//   names them. Objects are written before the manifest that points at them, so a node killed
//   at any point leaves the previous manifest whole; a failed Publish changes no manifest.
// - Objects are never modified; a publication uploads only pack bytes past what earlier ones
//   uploaded (plus the catalog image, compacted). Concurrent callers share a publication that
//   starts after they called (group commit).
// - Uploads ahead: while files are being written, a thread uploads every whole segment of the
//   active packs that holds only records written whole (checked by their headers and
//   checksums), so that a Publish() has little left to send. A manifest names such a segment
//   only once the catalog image it names has committed every byte of it; one the image does
//   not cover is left to later publications, or unnamed (gc collects it) if a publication
//   uploads a shorter segment over its range.
// - Memory: one segment (segment_bytes) per transfer, four transfers at a time.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/objstore/remote_packs.h"
#include "engine/objstore/s3_client.h"
#include "engine/objstore/s3_config.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {
class Store;
}

namespace ckptfs::objstore {

struct MirrorStats {
  uint64_t publications = 0;  // manifests written (a publication with nothing new writes none)
  uint64_t segments_uploaded = 0;
  uint64_t segment_bytes_uploaded = 0;  // pack bytes sent (segments another node had: none)
  uint64_t segments_deduplicated = 0;   // segments the bucket held already
  uint64_t catalog_bytes_uploaded = 0;
};

struct BucketGcOptions {
  // Objects and incomplete uploads younger than this are kept whatever names them: a
  // publication uploads its objects before the manifest that names them (longer than any).
  std::chrono::seconds grace{3600};
  // Manifests kept per node, newest first (at least 1; the newest is what a restore reads).
  int keep_manifests = 2;
};

struct BucketGcReport {
  uint64_t manifests_deleted = 0;
  uint64_t objects_deleted = 0;
  uint64_t bytes_deleted = 0;
  uint64_t objects_kept = 0;  // named by a kept manifest, or within the grace period
  uint64_t uploads_aborted = 0;
};

class BucketMirror {
 public:
  static constexpr uint64_t kDefaultSegmentBytes = uint64_t{8} << 20;
  // What a manifest names: its number, its catalog image and, per pack file, its segments.
  struct Publication {
    uint64_t seq = 0;
    std::string image_sha256;
    std::map<std::string, std::vector<PackSegment>> packs;
  };

  // Records the parameters of a new store (the ckptfs.json of `local_store`, a store just
  // created) at loc. AlreadyExists when loc holds a store.
  static Status InitBucket(S3Client& s3, const S3Location& loc,
                           const std::filesystem::path& local_store);
  // When `cache_dir` holds no store: fills it from the newest manifest of `node` (or, when the
  // node published none, with the store's ckptfs.json only): the catalog image, and each pack
  // as a sparse file of its published length whose records are read from the bucket on demand
  // (RemotePacks, named by cache_dir/remote-packs.json); no pack bytes are downloaded. Returns
  // that manifest's publication (seq 0: none), for Open. A cache that holds a store is left as
  // it is (nullopt).
  // The cache is not the durable copy (the bucket is): nothing Restore writes is synced but a
  // marker, kRestoreMarker, made durable first and removed by SettleRestore once the rest is
  // synced. A cache that still holds the marker (a crash came first) is restored again.
  // NotFound (saying to run `ckptfs init`) when loc holds no store.
  static constexpr const char* kRestoreMarker = "restore-unsettled";
  static Result<std::optional<Publication>> Restore(S3Client& s3, const S3Location& loc,
                                                    const std::string& node,
                                                    const std::filesystem::path& cache_dir);
  // Syncs what Restore wrote into cache_dir, then removes its marker (durably). OK when there
  // is no marker. May run while the store serves (it only syncs files).
  static Status SettleRestore(const std::filesystem::path& cache_dir);
  // REQUIRES: store is open on the directory Restore filled, and outlives the mirror.
  // `remote` (may be null): the store's remote packs; a publication names their segments
  // (the bucket holds them) instead of uploading the local sparse files. `newest`: the node's
  // newest publication when the caller has just read it (what Restore returned), else read
  // from the bucket.
  static Result<std::unique_ptr<BucketMirror>> Open(S3Client* s3, S3Location loc, std::string node,
                                                    Store* store,
                                                    const RemotePacks* remote = nullptr,
                                                    std::optional<Publication> newest = {},
                                                    uint64_t segment_bytes = kDefaultSegmentBytes);

  ~BucketMirror();
  BucketMirror(const BucketMirror&) = delete;
  BucketMirror& operator=(const BucketMirror&) = delete;

  Status Publish();
  // The newest manifest this mirror wrote or found (0: none). After Publish() returned OK, it
  // holds every content committed before that call.
  uint64_t published_seq();
  const S3Location& location() const { return loc_; }
  const std::string& node() const { return node_; }

  // Mark and sweep over the bucket: keeps each node's newest keep_manifests manifests, every
  // manifest a version part names (remote_versions.h) and every manifest younger than the
  // grace period, deletes the other manifests, then every
  // object that no kept manifest names and that is older than the grace period, and aborts
  // incomplete multipart uploads older than it. Safe with nodes publishing meanwhile, as long
  // as no upload takes longer than the grace period.
  static Result<BucketGcReport> CollectGarbage(S3Client& s3, const S3Location& loc,
                                               const BucketGcOptions& options);
  MirrorStats stats() const;
  static Result<Publication> ReadPublication(S3Client& s3, const S3Location& loc,
                                             const std::string& node, uint64_t seq);
  // An object named by its SHA-256 (objects/<sha256>), checked against its name.
  static Result<Buffer> GetObject(S3Client& s3, const S3Location& loc, const std::string& sha256);
  // The key of `node`'s manifest number `seq` under loc.
  static std::string ManifestKey(const S3Location& loc, const std::string& node, uint64_t seq);

 private:
  using Segment = PackSegment;
  BucketMirror(S3Client* s3, S3Location loc, std::string node, Store* store,
               const RemotePacks* remote, uint64_t segment_bytes);
  // One publication. REQUIRES: run_mu_ held.
  Status PublishNow() REQUIRES(run_mu_);
  struct Range {
    std::string file;
    uint64_t offset = 0, length = 0;
  };
  // Uploads pack bytes so that every pack holds at least `lengths` (pack file -> bytes); the
  // ranges it uploaded (or found deleted) go to *uploaded when given.
  Status UploadPacks(const std::map<std::string, uint64_t>& lengths, std::vector<Range>* uploaded)
      REQUIRES(run_mu_);
  // True when a hole (a punched block) lies in one of `ranges` of the local packs, or one of
  // their packs is gone (deleted by the store's gc).
  Result<bool> AnyHole(const std::vector<Range>& ranges) const;
  // One pass of the upload ahead (above): the active pack's whole segments of records written
  // whole, past what is uploaded. True when it uploaded some (there may be more).
  bool UploadAhead() REQUIRES(run_mu_);
  // The same for one of them.
  bool UploadAheadOf(uint32_t pack_id) REQUIRES(run_mu_);
  // The end of the records written whole in `file` from `from` (a record boundary) on.
  uint64_t WrittenEnd(const std::string& file, uint64_t from) const;
  // Uploads one segment (unless the bucket holds it); nullopt when the pack file is gone.
  // Touches no member but the stats.
  Result<std::optional<Segment>> UploadSegment(const std::string& file, uint64_t offset,
                                               uint64_t length);

  S3Client* const s3_;
  const S3Location loc_;
  const std::string node_;
  Store* const store_;
  const RemotePacks* const remote_;
  const uint64_t segment_bytes_;

  mutable Mutex mu_;
  uint64_t requested_ GUARDED_BY(mu_) = 0;  // publications asked for
  uint64_t covered_ GUARDED_BY(mu_) = 0;    // asks the last finished publication covered
  Status last_ GUARDED_BY(mu_);             // its result
  MirrorStats stats_ GUARDED_BY(mu_);

  Mutex run_mu_;  // one publication at a time; lock order: run_mu_, then mu_
  uint64_t seq_ GUARDED_BY(run_mu_) = 0;             // the last manifest written
  std::string last_image_ GUARDED_BY(run_mu_);       // its catalog image (SHA-256)
  bool uploaded_since_ GUARDED_BY(run_mu_) = false;  // segments uploaded since it was written
  std::map<std::string, std::vector<Segment>> packs_ GUARDED_BY(run_mu_);
  // Segments uploaded ahead, contiguous from the end of packs_[file] on, not named yet.
  std::map<std::string, std::vector<Segment>> ahead_ GUARDED_BY(run_mu_);
  std::map<std::string, uint64_t> written_ GUARDED_BY(run_mu_);  // a record boundary, checked
  bool stopping_ GUARDED_BY(mu_) = false;
  CondVar stop_cv_;
  std::thread ahead_thread_;  // runs UploadAhead() every kAheadInterval until stopping_
};

}  // namespace ckptfs::objstore
