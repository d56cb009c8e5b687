// engine/snapshot/snapshot_engine.h
//
// The snapshot engine: runs inside the training process and saves this rank's tensors as one
// safetensors file of a sharded version, in two phases (docs/snapshot.md):
//
//   auto engine = *Engine::Open(*ConnectDaemon(socket), rank, world_size, EngineOptions{});
//   auto snap = *engine->Start("global_step100", tensors);  // returns at once
//   CKPTFS_RETURN_IF_ERROR(snap->WaitStaged());   // the tensors may be modified again
//   CKPTFS_RETURN_IF_ERROR(snap->Wait());         // durable and visible in the mount
//
// Stage: the backend fingerprints every block (block_bytes) of every tensor where it lives;
// blocks whose fingerprint and length equal the same block of this engine's previous
// snapshot are not copied and become references to the previous chunk; runs of changed blocks
// are copied into the host ring. Persist (worker pool, while training goes on): SHA-256 chunk
// id; the encoding of codec/piece_codec.h (byte planes by the dtype's element width, and a
// delta against the previous snapshot's chunk of the same block, read back from its pack by
// record_chain.h, when that is smaller); a record appended to the rank's reserved pack; then
// fdatasync and the commit. Chunks are the blocks plus the safetensors header, so unchanged
// blocks reuse chunks. Delta chains are bounded by max_delta_chain and by the store's bound.
// One snapshot at a time: Start waits for the previous one to finish.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/codec/codec.h"
#include "engine/snapshot/backend.h"
#include "engine/snapshot/host_ring.h"
#include "engine/snapshot/record_chain.h"
#include "engine/snapshot/sink.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"
#include "engine/util/worker_pool.h"

namespace ckptfs::snapshot {

enum class BackendKind { kAuto, kCpu, kCuda };

struct EngineOptions {
  uint64_t block_bytes = 1u << 20;  // fingerprint blocks = chunks
  uint64_t ring_bytes = 256u << 20;
  uint64_t max_copy_bytes = 64u << 20;  // the largest single copy of a run of changed blocks
  int workers = 0;                      // persist threads; 0: one per CPU
  // A chunk is rebuilt from at most this many records (the daemon's store may bound it lower);
  // 1 stores no deltas. Each persist thread holds up to three blocks while it encodes one.
  uint32_t max_delta_chain = 8;
  CodecSpec codec;
  BackendKind backend = BackendKind::kAuto;  // kAuto: CUDA when built and a device is present
};

struct SnapshotStats {
  uint64_t tensors = 0;
  uint64_t blocks = 0;
  uint64_t blocks_unchanged = 0;  // equal fingerprints: neither copied nor stored
  uint64_t bytes = 0;             // tensor bytes of the snapshot
  uint64_t bytes_copied = 0;      // staged into the ring
  uint64_t records_written = 0;
  uint64_t record_bytes = 0;            // header + payload of the records written
  uint64_t chunks_deduped = 0;          // copied, but their bytes were already stored
  uint64_t records_delta = 0;           // records stored as a delta against the previous snapshot
  uint64_t delta_bases_unreadable = 0;  // changed blocks whose base could not be read back
  double stage_seconds = 0;             // Start to WaitStaged
  double persist_seconds = 0;           // Start to the rank's commit accepted
  double total_seconds = 0;             // Start to Wait
};

class Engine;

class Snapshot {
 public:
  ~Snapshot();
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  Status WaitStaged();
  // This rank's part is durable and accepted by the daemon (the version may not be visible).
  Status WaitCommitted();
  // The version is durable and visible.
  Status Wait();
  SnapshotStats stats() const;

 private:
  friend class Engine;
  enum class Phase { kStaging, kStaged, kCommitted, kDone };
  struct Region;  // one staged copy
  // One chunk of the file: the header (slot 0), then each tensor's blocks.
  struct Slot {
    Fingerprint fp;
    CommitChunk chunk;
    uint8_t width = 1;  // element width of its tensor
    // Where its bytes are stored (null: unknown); a changed block's delta base candidate.
    std::shared_ptr<const StoredRecord> record, base;
  };
  Snapshot(Engine* engine, std::string version, std::vector<TensorDesc> tensors,
           std::map<std::string, std::string> metadata);
  void Run();
  Status Stage();
  Status Persist();
  Status CopyRun(size_t tensor, uint64_t first_block, uint64_t end_block);
  void PersistBlock(std::shared_ptr<Region> region, size_t slot, uint64_t region_offset);
  Status StoreChunk(size_t slot, const std::byte* raw, size_t n);
  // Appends the record of slot's chunk (its id set) to the pack; fills its chunk and record.
  Status WriteRecord(Slot& slot, Bytes raw, const Buffer* base);
  void Fail(const Status& s);
  void Advance(Phase phase, Status s);
  Status WaitFor(Phase phase);

  Engine* const engine_;
  const std::string version_;
  std::vector<TensorDesc> tensors_;
  const std::map<std::string, std::string> metadata_;  // extra __metadata__ entries
  std::string header_;                    // the safetensors header (length prefix included)
  std::vector<uint64_t> tensor_offsets_;  // in the file
  std::vector<size_t> first_slot_;        // of each tensor
  std::vector<Slot> slots_;               // each task fills its own slot
  PackTarget pack_;
  FileDescriptor pack_fd_;
  std::atomic<uint64_t> pack_end_{0};
  std::unique_ptr<PackReader> bases_;  // the packs of earlier snapshots, for delta bases
  uint32_t max_delta_chain_ = 1;
  Mutex dedup_mu_;
  std::unordered_map<ChunkId, Slot> written_ GUARDED_BY(dedup_mu_);
  std::thread driver_;

  Mutex task_mu_;
  CondVar task_cv_;
  size_t tasks_pending_ GUARDED_BY(task_mu_) = 0;

  mutable Mutex mu_;
  CondVar cv_;
  Phase phase_ GUARDED_BY(mu_) = Phase::kStaging;
  Phase ok_through_ GUARDED_BY(mu_) = Phase::kStaging;  // the last phase reached without error
  Status error_ GUARDED_BY(mu_);                        // the first failure
  SnapshotStats stats_ GUARDED_BY(mu_);                 // (the seconds; counters are atomics)
  std::atomic<uint64_t> blocks_unchanged_{0}, bytes_copied_{0}, records_written_{0},
      record_bytes_{0}, chunks_deduped_{0}, records_delta_{0}, delta_bases_unreadable_{0};
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Open(std::unique_ptr<PersistSink> sink, int rank,
                                              int world_size, const EngineOptions& options);
  // Waits for the snapshot in flight.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts a snapshot of `tensors` (their memory must stay valid, unmodified, until
  // WaitStaged returns) as version `version`. Waits for the previous snapshot to finish.
  // `metadata` entries go into the safetensors file's __metadata__ (the Python side keeps the
  // state dict's non-tensor leaves there); names starting "ckptfs." other than "ckptfs.extra"
  // and "format" are reserved.
  Result<std::shared_ptr<Snapshot>> Start(const std::string& version,
                                          std::vector<TensorDesc> tensors,
                                          std::map<std::string, std::string> metadata = {});
  const std::string& backend_name() const { return backend_name_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const EngineOptions& options() const { return options_; }

 private:
  friend class Snapshot;
  // The previous snapshot's block of a tensor: what an unchanged block refers to.
  struct PrevBlock {
    Fingerprint fp;
    uint64_t len = 0;
    ChunkId id;
    std::shared_ptr<const StoredRecord> record;  // where its bytes are; null: unknown
  };
  using BlockTable = std::unordered_map<std::string, std::vector<PrevBlock>>;
  Engine(std::unique_ptr<PersistSink> sink, int rank, int world_size, const EngineOptions& o);

  std::unique_ptr<PersistSink> sink_;
  const int rank_;
  const int world_size_;
  EngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::string backend_name_;
  std::unique_ptr<HostRing> ring_;
  std::unique_ptr<WorkerPool> pool_;

  Mutex mu_;
  std::shared_ptr<Snapshot> current_ GUARDED_BY(mu_);
  // Written by the snapshot's driver thread once its version is complete; read by the next
  // snapshot's driver (snapshots never overlap).
  BlockTable prev_;
};

}  // namespace ckptfs::snapshot
