// engine/store/pack_writer.h
//
// Appends records to the active pack file of their lane, starting a new pack once the active
// one reaches its target size. Writes go through io_uring when the kernel allows it (submitted
// asynchronously), else through pwrite.
//
// Lanes (PackLane, record.h): each lane has a pack of its own being appended to, so that
// records that die together lie together. The store sends the records that later re-encoding
// replaces (a version's changed tensor pieces, raw pieces waiting for compression) to kMain,
// and the ones nothing replaces (non-tensor bytes, first versions' pieces) to kLasting: once a
// version's tensor pieces are replaced, their dead run punches out in whole blocks, where a
// small live record between two dead ones kept the 4 KiB blocks it shares with them
// (docs/engine.md "Pack lanes"). A pack's header names its lane; a reopened store resumes one
// pack per lane.
//
// Direct writes (Options::direct_io, the default, where the pack's filesystem takes O_DIRECT):
// records are copied into aligned segments of kSegmentBytes, and each full segment is written
// with O_DIRECT, so a checkpoint's bytes are neither copied into the page cache nor written
// back from it (a pack is written once and read rarely; docs/engine.md "Direct pack writes").
// The partial segment at the tail is written, padded to its block, when Sync, WaitWritten or
// Rotate need it on disk, and again (whole blocks) as it fills. Bytes past a pack's length are
// padding, cut at the next open like any uncommitted tail. A new pack whose first O_DIRECT
// write (its header block) is refused is written through the page cache instead: each record
// from the caller's buffer, kept until its write completes.
//
//   auto loc = writer->Append(header, std::move(payload));   // location of the record
//   CKPTFS_RETURN_IF_ERROR(writer->Sync());                  // durable ...
//   if (!writer->IsDurable(*loc)) ...                        // ... unless its write failed
//
// A failed write (ENOSPC, EIO) caps its pack at the failed offset: records at or past it are
// never durable, IsDurable says so, and the next Append starts a fresh pack. Durable records
// are what the catalog may record as committed; bytes past a pack's committed length are cut
// when the store opens.
// Thread-safe.
#pragma once

#include <liburing.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "engine/store/record.h"
#include "engine/util/buffer.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {

struct PackLocation {
  uint32_t pack_id = 0;
  uint64_t offset = 0;  // of the record header
  uint32_t length = 0;  // header + payload
};

struct PackExtent {
  uint32_t pack_id = 0;
  uint64_t length = 0;
  PackLane lane = PackLane::kMain;
};

class PackWriter {
 public:
  struct Options {
    uint64_t target_bytes = 1ull << 30;
    bool use_io_uring = true;
    // The most memory (headers and payload buffers, by capacity) queued on the ring, not yet
    // written (at least one record always is). The queue is memory like the write pipeline's:
    // the Store counts it in its in-flight budget.
    size_t queue_bytes = 16u << 20;
    bool direct_io = true;
  };
  static constexpr size_t kSegmentBytes = 2u << 20;
  // Appends to the packs of `resume` (each already cut to its committed length, at most one
  // per lane) that are still under target; other lanes create a pack (from `next_id` on) at
  // their first record.
  static Result<std::unique_ptr<PackWriter>> Open(const std::filesystem::path& dir,
                                                  const Options& options,
                                                  const std::vector<PackExtent>& resume,
                                                  uint32_t next_id);
  ~PackWriter();
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;

  // Appends one record: the header, then, for a delta, its base's id (the first bytes of a
  // delta's payload, record.h; header.stored_len counts them), then `payload`, so a delta's
  // encoded bytes need no copy behind the id, to the active pack of `lane`. The payload is
  // owned until its write completes; while the queue of such writes holds
  // Options::queue_bytes, Append waits for completions.
  Result<PackLocation> Append(const RecordHeader& header, Buffer payload,
                              const std::optional<ChunkId>& delta_base = std::nullopt,
                              PackLane lane = PackLane::kMain);
  // The same, with a payload shared with others (the chunk cache): kept until written, never
  // changed.
  Result<PackLocation> Append(const RecordHeader& header, std::shared_ptr<const Buffer> payload,
                              const std::optional<ChunkId>& delta_base = std::nullopt,
                              PackLane lane = PackLane::kMain);
  // Returns once every record appended before the call is on disk or known to have failed.
  Status Sync();
  // Returns once every record appended before the call has been written (not necessarily
  // synced), so that it can be read back through another descriptor.
  Status WaitWritten();
  // True when the record at `loc` was written successfully and synced.
  bool IsDurable(const PackLocation& loc) const;
  // Gives back the blocks of dead ranges [from, to) of pack `pack_id` (PunchRange, file.h): the
  // bytes read as zeros after, also where the pack's tail is still being written (its segment
  // in memory is zeroed too, so that a later write of the tail does not bring them back), and
  // a range's edge blocks go where the rest of them reads as zeros already and is on disk for
  // good. The ranges must be dead (no row or pin points into them). NotSupported where the
  // filesystem has no holes.
  Status PunchDead(uint32_t pack_id, const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  // Punches are numbered; the last number given out (0: none yet).
  uint64_t punch_seq() const;
  // Whether a punch numbered above `seq` may have changed bytes of [from, to) of pack
  // `pack_id`: one that did, or (conservatively) any, once the log of recent punches no longer
  // reaches back to `seq`. A reader that copies pack bytes takes punch_seq() before it learns
  // which records are live, and asks this of what it read after (a byte-exact punch zeroes
  // partial blocks in place, which leaves no hole to find).
  bool PunchedSince(uint64_t seq, uint32_t pack_id, uint64_t from, uint64_t to) const;
  // Closes the active packs (synced); each lane starts a new one on its next Append.
  Status Rotate();
  // The active packs and the bytes appended to each (a file may be longer: a direct pack's
  // block padding).
  std::vector<PackExtent> active_extents() const;
  // Reserves a pack id this writer will never use, for a pack another process writes
  // (Store::CreateExternalPack).
  uint32_t ReserveId();
  bool using_io_uring() const { return uring_ok_; }
  // Whether the active pack (or else the last one started) is written with O_DIRECT.
  bool using_direct_io() const;

 private:
  struct PackState {
    uint32_t id = 0;
    PackLane lane = PackLane::kMain;
    std::shared_ptr<FileDescriptor> fd;
    std::filesystem::path path;
    uint64_t length = 0;              // bytes appended (including the header)
    uint64_t synced = 0;              // bytes known durable
    uint64_t failed_at = UINT64_MAX;  // first byte of the first failed write
    uint64_t writeback_from = 0;      // writeback has been started for bytes before this
    // Direct writes: the O_DIRECT descriptor (null for a pack written through the page cache)
    // and the segment being filled, which starts at seg_offset (aligned) and holds the pack's
    // bytes up to `length`; seg_written: how many of them are on disk (a flushed tail). A
    // write of the segment starts at the block that holds seg_written: the blocks before it
    // are on disk already, and writing them again would bring back what PunchDead punched.
    std::shared_ptr<FileDescriptor> direct;
    Buffer seg;
    uint64_t seg_offset = 0;
    uint64_t seg_written = 0;
  };
  struct InflightWrite;

  PackWriter(std::filesystem::path dir, Options options);
  Status StartPack(uint32_t id, PackLane lane, std::optional<uint64_t> resume_length) REQUIRES(mu_);
  // Closes pack `active` (an entry of active_, set to 0).
  Status ClosePack(uint32_t& active) REQUIRES(mu_);
  Status SubmitWrite(std::unique_ptr<InflightWrite> write) REQUIRES(mu_);
  // Direct writes: copies `bytes` into the pack's segments, submitting each one that fills.
  Status AppendToSegments(PackState& st, Bytes bytes) REQUIRES(mu_);
  // Writes the partial tail segment (padded to its block) synchronously, if not on disk yet; a
  // failure caps the pack (failed_at) as a failed record write does.
  Status FlushTail(PackState& st) REQUIRES(mu_);
  // The write itself, nothing recorded.
  Status WritePaddedTail(PackState& st) REQUIRES(mu_);
  // Where a write of the segment starts: the block that holds seg_written.
  static uint64_t UnwrittenFrom(const PackState& st) {
    return std::max(st.seg_offset, AlignDownForDirectIo(st.seg_written));
  }
  Buffer NewSegment() REQUIRES(mu_);
  // Direct packs: the segment of a pack `length` bytes long whose last block starts with
  // `tail`; unless that is `on_disk` already, the block is written at once (the probe), and a
  // refused probe turns direct writes off for the pack.
  Status StartSegment(PackState& st, uint64_t length, Bytes tail, bool on_disk) REQUIRES(mu_);
  // Waits for completions: at least one when `wait_one`, else only those already done.
  Status Reap(bool wait_one) REQUIRES(mu_);
  void Complete(InflightWrite* write, int result) REQUIRES(mu_);
  // Starts writeback of the pack's written bytes once enough have gathered, so that the next
  // Sync() finds little dirty data (sync_file_range; asynchronous on the ring).
  void StartWriteback(PackState& st, uint64_t end) REQUIRES(mu_);
  Status WaitAllInflight() REQUIRES(mu_);
  PackState& State(uint32_t id) REQUIRES(mu_) { return packs_[id]; }

  const std::filesystem::path dir_;
  const Options options_;
  mutable Mutex mu_;
  std::map<uint32_t, PackState> packs_ GUARDED_BY(mu_);
  // Per lane, the pack appended to; 0: none (start one on Append).
  std::array<uint32_t, kPackLanes> active_ GUARDED_BY(mu_){};
  uint32_t next_id_ GUARDED_BY(mu_) = 1;
  bool uring_ok_ = false;  // set by Open, then read-only
  io_uring ring_ GUARDED_BY(mu_){};
  size_t inflight_ GUARDED_BY(mu_) = 0;      // ring entries not yet reaped
  size_t queued_bytes_ GUARDED_BY(mu_) = 0;  // record bytes of those entries
  Status last_error_ GUARDED_BY(mu_);
  std::vector<Buffer> free_segments_ GUARDED_BY(mu_);  // written segments, for reuse
  // The most recent punches, oldest first (PunchedSince): each range widened to whole blocks.
  struct Punch {
    uint64_t seq = 0;
    uint32_t pack_id = 0;
    uint64_t from = 0, to = 0;
  };
  static constexpr size_t kPunchLog = 8192;
  std::deque<Punch> punches_ GUARDED_BY(mu_);
  uint64_t punch_seq_ GUARDED_BY(mu_) = 0;
  bool last_direct_ GUARDED_BY(mu_) = false;
};

}  // namespace ckptfs
