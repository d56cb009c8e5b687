// engine/objstore/remote_packs.h
//
// Reads on demand (docs/scale-out.md): the records of a node's packs as they were published
// to the bucket, fetched with ranged GETs of the segments that hold them, so that a mount on
// an empty cache serves at once instead of downloading the whole store first.
//
//   // After BucketMirror::Restore left CACHE/remote-packs.json (the packs it did not fetch):
//   CKPTFS_ASSIGN_OR_RETURN(auto remote, RemotePacks::Open(&s3, loc, cache_dir));
//   options.remote_records = remote;   // null when the cache holds every record itself
//   auto store = Store::Open(cache_dir, options);
//
// Guarantees:
// - Holds() is true exactly for records inside the published length of a pack named in
//   remote-packs.json; everything the store appends later is local.
// - Read() returns the bytes of the pack as published: from a prefetched run when one covers
//   the record, else with a ranged GET per segment the record spans. The bytes are checked by
//   the chunk reader against the record's own checksums (remote_records.h).
// - WillNeed() coalesces adjacent records of one segment into runs of up to run_bytes, adds
//   runs for the read_ahead_bytes of the pack after them, and fetches them on fetch_threads
//   threads, several in flight: the window's runs before any read-ahead not started yet, and
//   a Read() that needs a run no thread has started fetches it itself. Runs are dropped once
//   all their bytes were read; the bytes held by runs are at most prefetch_bytes (a window's
//   runs evict the oldest fetched runs first; read-ahead evicts nothing, and what does not fit
//   is not prefetched). A record may be read from several runs.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/objstore/s3_client.h"
#include "engine/objstore/s3_config.h"
#include "engine/store/remote_records.h"
#include "engine/util/mutex.h"

namespace ckptfs::objstore {

struct RemotePacksOptions {
  uint64_t prefetch_bytes = 64ull << 20;  // bytes of prefetched runs held at most
  uint64_t run_bytes = 4ull << 20;        // one ranged GET of a prefetch window, at most
  int fetch_threads = 4;                  // ranged GETs of prefetch windows in flight
  // Pack bytes fetched past the end of a prefetch window (records are read in the order they
  // were written, mostly); 0: none.
  uint64_t read_ahead_bytes = 32ull << 20;
};

// One published segment of a pack: bytes [offset, offset + length) of the pack file are the
// object objects/<sha256>.
struct PackSegment {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string sha256;
};

class RemotePacks final : public RemoteRecords {
 public:
  // The file Restore leaves in a cache it filled on demand.
  static constexpr const char* kFileName = "remote-packs.json";
  // Writes `packs` (pack file name -> segments, contiguous from 0) into cache_dir/kFileName,
  // atomically; synced unless `sync` is false (a restore, which syncs it later).
  // REQUIRES: called before the cache's ckptfs.json is written.
  static Status Record(const std::filesystem::path& cache_dir,
                       const std::map<std::string, std::vector<PackSegment>>& packs,
                       bool sync = true);
  // The remote packs of the cache at cache_dir (none when it has no kFileName: a cache that
  // holds every record). REQUIRES: s3 outlives the result.
  static Result<std::shared_ptr<RemotePacks>> Open(S3Client* s3, S3Location loc,
                                                   const std::filesystem::path& cache_dir,
                                                   RemotePacksOptions options = {});
  ~RemotePacks() override;

  // Adds packs (local pack id -> segments, contiguous from 0; another node's packs that an
  // imported version's records lie in, remote_versions.h) and records them in
  // cache_dir/kFileName, synced, before it returns. An id named before is replaced (its pack
  // file was deleted, and the caller has just created a new one with that id).
  Status AddPacks(const std::map<uint32_t, std::vector<PackSegment>>& packs);
  // The segments of a pack (empty when it is not remote).
  std::vector<PackSegment> Segments(uint32_t pack_id) const;

  bool Holds(uint32_t pack_id, uint64_t offset, uint64_t length) const override;
  Status Read(uint32_t pack_id, uint64_t offset, MutableBytes header,
              MutableBytes payload) const override;
  void WillNeed(std::vector<RecordRange> records) const override;

  // Ranged GETs made and bytes they brought, prefetch runs included.
  uint64_t gets() const { return gets_.load(std::memory_order_relaxed); }
  uint64_t fetched_bytes() const { return fetched_bytes_.load(std::memory_order_relaxed); }
  // Bytes of prefetched runs held now (at most options.prefetch_bytes).
  uint64_t held_bytes() const;

 private:
  using Fetched = Result<std::shared_ptr<const Buffer>>;
  struct Run {
    uint64_t end = 0;
    std::shared_future<Fetched> data;
    uint64_t unread = 0;  // bytes of records not read from it yet
    uint64_t order = 0;   // when it was started (eviction: oldest first)
  };
  RemotePacks(S3Client* s3, S3Location loc, std::filesystem::path cache_dir,
              std::map<uint32_t, std::vector<PackSegment>> packs, RemotePacksOptions options);
  // The segment of `pack_id` that holds `offset`, or nullopt.
  std::optional<PackSegment> SegmentAt(uint32_t pack_id, uint64_t offset) const;
  // Bytes [offset, offset + length) of the pack, which lie in `seg`: one ranged GET.
  Result<Buffer> Fetch(const PackSegment& seg, uint64_t offset, uint64_t length) const;
  Fetched FetchRun(const PackSegment& seg, uint64_t begin, uint64_t end) const;
  // True when a run holds a byte of [offset, end) of the pack. REQUIRES: mu_ held.
  bool Covered(uint32_t pack_id, uint64_t offset, uint64_t end) const REQUIRES(mu_);
  // Room for `bytes` more, evicting the oldest fetched runs. REQUIRES: mu_ held.
  bool MakeRoom(uint64_t bytes) const REQUIRES(mu_);
  void FetchLoop() const;

  S3Client* const s3_;
  const S3Location loc_;
  const std::filesystem::path cache_dir_;
  const RemotePacksOptions options_;
  mutable Mutex packs_mu_;  // lock order: mu_, then packs_mu_
  std::map<uint32_t, std::vector<PackSegment>> packs_ GUARDED_BY(packs_mu_);  // by offset

  mutable Mutex mu_;
  // (pack, begin) -> run; runs do not overlap.
  mutable std::map<std::pair<uint32_t, uint64_t>, Run> runs_ GUARDED_BY(mu_);
  mutable uint64_t held_ GUARDED_BY(mu_) = 0;
  mutable uint64_t next_order_ GUARDED_BY(mu_) = 0;
  struct Job {
    PackSegment seg;
    uint32_t pack = 0;
    uint64_t begin = 0, end = 0;  // within the pack
    std::shared_ptr<std::promise<Fetched>> done;
  };
  // Takes the queued job of the run at (pack, begin), if no thread has started it. REQUIRES:
  // mu_ held.
  std::optional<Job> TakeQueued(uint32_t pack_id, uint64_t begin) const REQUIRES(mu_);
  // Runs not started yet: those of prefetch windows (records asked for) go before the
  // read-ahead past them, so a reader never waits behind bytes it will need later.
  mutable std::deque<Job> wanted_ GUARDED_BY(mu_);
  mutable std::deque<Job> ahead_ GUARDED_BY(mu_);
  mutable bool stopping_ GUARDED_BY(mu_) = false;
  mutable CondVar queue_cv_;
  std::vector<std::thread> threads_;
  mutable std::atomic<uint64_t> gets_{0};
  mutable std::atomic<uint64_t> fetched_bytes_{0};
};

}  // namespace ckptfs::objstore
