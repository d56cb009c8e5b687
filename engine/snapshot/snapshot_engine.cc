#include "engine/snapshot/snapshot_engine.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "engine/codec/piece_codec.h"
#include "engine/format/dtype.h"
#include "engine/store/record.h"
#include "engine/util/coding.h"
#include "engine/util/file.h"

namespace ckptfs::snapshot {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The safetensors header of the file: 8-byte little-endian length, then JSON padded with
// spaces to a multiple of 8. Tensors follow back to back in the given order.
std::string SafetensorsHeader(const std::vector<TensorDesc>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const std::string& version, int rank, int world_size,
                              std::vector<uint64_t>* offsets) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"},
                       {"ckptfs.version", version},
                       {"ckptfs.rank", std::to_string(rank)},
                       {"ckptfs.world_size", std::to_string(world_size)}};
  for (const auto& [key, value] : metadata) h["__metadata__"][key] = value;
  uint64_t at = 0;
  offsets->clear();
  for (const TensorDesc& t : tensors) {
    offsets->push_back(at);
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.nbytes}}};
    at += t.nbytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  PutLE<uint64_t>(out.data(), text.size());
  out += text;
  for (uint64_t& o : *offsets) o += out.size();
  return out;
}

// This rank's part of the version's manifest.json.
std::string ShardJson(const std::vector<TensorDesc>& tensors, const std::string& file, int rank) {
  nlohmann::ordered_json s;
  s["rank"] = rank;
  s["file"] = file;
  nlohmann::ordered_json ts = nlohmann::ordered_json::object();
  for (const TensorDesc& t : tensors) {
    std::vector<int64_t> global = t.global_shape.empty() ? t.shape : t.global_shape;
    std::vector<int64_t> offsets =
        t.offsets.empty() ? std::vector<int64_t>(t.shape.size(), 0) : t.offsets;
    ts[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"global_shape", global}, {"offsets", offsets}};
  }
  s["tensors"] = ts;
  return s.dump();
}

}  // namespace

struct Snapshot::Region {
  size_t at = 0;                     // ring offset
  std::atomic<uint64_t> pending{0};  // blocks not yet stored
};

Snapshot::Snapshot(Engine* engine, std::string version, std::vector<TensorDesc> tensors,
                   std::map<std::string, std::string> metadata)
    : engine_(engine),
      version_(std::move(version)),
      tensors_(std::move(tensors)),
      metadata_(std::move(metadata)) {}

Snapshot::~Snapshot() {
  if (driver_.joinable()) driver_.join();
}

void Snapshot::Fail(const Status& s) {
  MutexLock lock(mu_);
  if (error_.ok()) error_ = s;
}

void Snapshot::Advance(Phase phase, Status s) {
  {
    MutexLock lock(mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    phase_ = phase;
    if (error_.ok()) ok_through_ = phase;
  }
  cv_.NotifyAll();
}

Status Snapshot::WaitFor(Phase phase) {
  MutexLock lock(mu_);
  while (phase_ < phase) cv_.Wait(lock);
  if (ok_through_ >= phase) return Status::OK();
  return error_;
}

Status Snapshot::WaitStaged() { return WaitFor(Phase::kStaged); }
Status Snapshot::WaitCommitted() { return WaitFor(Phase::kCommitted); }
Status Snapshot::Wait() { return WaitFor(Phase::kDone); }

SnapshotStats Snapshot::stats() const {
  MutexLock lock(mu_);
  SnapshotStats s = stats_;
  s.blocks_unchanged = blocks_unchanged_.load();
  s.bytes_copied = bytes_copied_.load();
  s.records_written = records_written_.load();
  s.record_bytes = record_bytes_.load();
  s.chunks_deduped = chunks_deduped_.load();
  s.records_delta = records_delta_.load();
  s.delta_bases_unreadable = delta_bases_unreadable_.load();
  return s;
}

void Snapshot::Run() {
  const auto start = Clock::now();
  Status s = Stage();
  {
    MutexLock lock(mu_);
    stats_.stage_seconds = Seconds(start);
  }
  Advance(Phase::kStaged, s);
  {  // every persist task (and copy) has finished before anything else happens
    if (!s.ok()) (void)engine_->backend_->Drain();
    MutexLock lock(task_mu_);
    while (tasks_pending_ != 0) task_cv_.Wait(lock);
  }
  if (s.ok()) s = Persist();
  {
    MutexLock lock(mu_);
    stats_.persist_seconds = Seconds(start);
  }
  Advance(Phase::kCommitted, s);
  if (s.ok()) s = engine_->sink_->WaitComplete();
  pack_fd_ = FileDescriptor();
  bases_.reset();  // no pack stays open (gc may delete them) between snapshots
  if (s.ok()) {
    // The version exists: its chunks are what the next snapshot's unchanged blocks refer to.
    Engine::BlockTable table;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      auto& blocks = table[tensors_[i].name];
      const size_t n =
          (i + 1 < tensors_.size() ? first_slot_[i + 1] : slots_.size()) - first_slot_[i];
      for (size_t b = 0; b < n; ++b) {
        const Slot& slot = slots_[first_slot_[i] + b];
        blocks.push_back({slot.fp, slot.chunk.raw_len, slot.chunk.id, slot.record});
      }
    }
    engine_->prev_ = std::move(table);
  }
  {
    MutexLock lock(mu_);
    stats_.total_seconds = Seconds(start);
  }
  Advance(Phase::kDone, s);
}

Status Snapshot::Stage() {
  const EngineOptions& o = engine_->options_;
  std::unordered_set<std::string> names;
  for (const TensorDesc& t : tensors_) {
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("tensor name " + t.name + " appears twice");
    }
    if (t.data == nullptr && t.nbytes > 0) return Status::InvalidArgument(t.name + ": no data");
  }
  for (const auto& [key, value] : metadata_) {
    if (key == "format" || (key.rfind("ckptfs.", 0) == 0 && key != "ckptfs.extra")) {
      return Status::InvalidArgument("metadata key " + key + " is reserved");
    }
  }
  header_ = SafetensorsHeader(tensors_, metadata_, version_, engine_->rank_, engine_->world_size_,
                              &tensor_offsets_);
  if (header_.size() > kMaxRecordRawBytes) {
    return Status::InvalidArgument("the safetensors header is larger than a chunk may be");
  }
  // Slot 0 is the header; then each tensor's blocks.
  size_t slots = 1;
  for (const TensorDesc& t : tensors_) {
    first_slot_.push_back(slots);
    slots += (t.nbytes + o.block_bytes - 1) / o.block_bytes;
  }
  slots_.resize(slots);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const std::optional<DType> dtype = DTypeFromSafetensorsName(tensors_[i].dtype);
    const size_t width = dtype ? ElementSize(*dtype) : 1;
    const size_t end = i + 1 < tensors_.size() ? first_slot_[i + 1] : slots;
    for (size_t k = first_slot_[i]; k < end; ++k) {
      slots_[k].width = static_cast<uint8_t>(std::clamp<size_t>(width, 1, kMaxPieceWidth));
    }
  }
  {
    MutexLock lock(mu_);
    stats_.tensors = tensors_.size();
    stats_.blocks = slots - 1;
    for (const TensorDesc& t : tensors_) stats_.bytes += t.nbytes;
  }

  PersistSink& sink = *engine_->sink_;
  CKPTFS_RETURN_IF_ERROR(sink.Begin(version_, engine_->rank_, engine_->world_size_));
  CKPTFS_ASSIGN_OR_RETURN(pack_, sink.ReservePack());
  CKPTFS_ASSIGN_OR_RETURN(pack_fd_, OpenFile(pack_.path, O_WRONLY));
  pack_end_ = kPackHeaderBytes;
  bases_ = std::make_unique<PackReader>(pack_.path.parent_path());
  max_delta_chain_ = std::max<uint32_t>(1, std::min(o.max_delta_chain, sink.max_delta_chain()));

  std::vector<Fingerprint> fps;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorDesc& t = tensors_[i];
    if (t.nbytes == 0) continue;
    CKPTFS_RETURN_IF_ERROR(engine_->backend_->Fingerprints(t, o.block_bytes, &fps));
    const std::vector<Engine::PrevBlock>* prev = nullptr;
    auto it = engine_->prev_.find(t.name);
    if (it != engine_->prev_.end()) prev = &it->second;
    const uint64_t blocks = fps.size();
    const uint64_t max_run = o.max_copy_bytes / o.block_bytes;
    uint64_t run = 0, run_len = 0;  // a run of changed blocks [run, run + run_len)
    for (uint64_t b = 0; b <= blocks; ++b) {
      bool changed = false;
      if (b < blocks) {
        Slot& slot = slots_[first_slot_[i] + b];
        const uint64_t len = std::min(o.block_bytes, t.nbytes - b * o.block_bytes);
        slot.fp = fps[b];
        slot.chunk.raw_len = static_cast<uint32_t>(len);
        const Engine::PrevBlock* before =
            prev != nullptr && b < prev->size() && (*prev)[b].len == len ? &(*prev)[b] : nullptr;
        if (before != nullptr && before->fp == fps[b]) {
          slot.chunk.id = before->id;
          slot.chunk.stored = false;
          slot.record = before->record;
          ++blocks_unchanged_;
        } else {
          changed = true;
          if (before != nullptr) slot.base = before->record;
        }
      }
      if (changed) {
        if (run_len == 0) run = b;
        ++run_len;
      }
      if (run_len > 0 && (!changed || run_len == max_run || b + 1 >= blocks)) {
        CKPTFS_RETURN_IF_ERROR(CopyRun(i, run, run + run_len));
        run_len = 0;
      }
      MutexLock lock(mu_);
      if (!error_.ok()) return error_;
    }
  }
  return engine_->backend_->Drain();
}

Status Snapshot::CopyRun(size_t tensor, uint64_t first_block, uint64_t end_block) {
  const TensorDesc& t = tensors_[tensor];
  const uint64_t bs = engine_->options_.block_bytes;
  const uint64_t off = first_block * bs;
  const uint64_t n = std::min(end_block * bs, t.nbytes) - off;
  CKPTFS_ASSIGN_OR_RETURN(size_t at, engine_->ring_->Allocate(n));
  auto region = std::make_shared<Region>();
  region->at = at;
  region->pending = end_block - first_block;
  bytes_copied_ += n;
  {
    MutexLock lock(task_mu_);
    tasks_pending_ += end_block - first_block;
  }
  const size_t first_slot = first_slot_[tensor] + first_block;
  auto done = [this, region, first_slot, first_block, end_block, bs](Status s) {
    for (uint64_t b = first_block; b < end_block; ++b) {
      const size_t slot = first_slot + (b - first_block);
      const uint64_t roff = (b - first_block) * bs;
      if (!s.ok()) {
        Fail(s);
        PersistBlock(region, SIZE_MAX, 0);  // releases without storing
        continue;
      }
      engine_->pool_->Submit([this, region, slot, roff] { PersistBlock(region, slot, roff); });
    }
  };
  Status s = engine_->backend_->CopyToHost(t, off, n, engine_->ring_->at(at), done);
  if (!s.ok()) done(s);
  return s;
}

void Snapshot::PersistBlock(std::shared_ptr<Region> region, size_t slot, uint64_t roff) {
  if (slot != SIZE_MAX) {
    bool failed;
    {
      MutexLock lock(mu_);
      failed = !error_.ok();
    }
    if (!failed) {
      Status s =
          StoreChunk(slot, engine_->ring_->at(region->at + roff), slots_[slot].chunk.raw_len);
      if (!s.ok()) Fail(s);
    }
  }
  if (--region->pending == 0) engine_->ring_->Release(region->at);
  // Notified under the lock: once the count reaches 0 the driver may finish and the snapshot
  // be destroyed, condition variable included (a notify after the unlock raced with
  // ~Snapshot; ThreadSanitizer, scripts/sanitize.sh tsan).
  MutexLock lock(task_mu_);
  --tasks_pending_;
  task_cv_.NotifyAll();
}

Status Snapshot::StoreChunk(size_t index, const std::byte* raw, size_t n) {
  Slot& slot = slots_[index];
  slot.chunk.id = ChunkId::Of({raw, n});
  slot.chunk.raw_len = static_cast<uint32_t>(n);
  {
    MutexLock lock(dedup_mu_);
    auto it = written_.find(slot.chunk.id);
    if (it != written_.end()) {  // the same bytes twice in this file: one record
      slot.chunk = it->second.chunk;
      slot.record = it->second.record;
      ++chunks_deduped_;
      return Status::OK();
    }
  }
  // The previous snapshot's chunk of this block, if its chain leaves room for one more record.
  std::optional<Buffer> base;
  if (slot.base && slot.base->raw_len == n && slot.base->depth < max_delta_chain_ &&
      slot.base->id != slot.chunk.id) {
    auto read = bases_->Read(*slot.base);
    if (read.ok()) {
      base = std::move(*read);
    } else {  // gc moved it, say: stored whole
      ++delta_bases_unreadable_;
      spdlog::debug("block stored without a delta: {}", read.status().ToString());
    }
  }
  CKPTFS_RETURN_IF_ERROR(WriteRecord(slot, {raw, n}, base ? &*base : nullptr));
  MutexLock lock(dedup_mu_);
  written_.emplace(slot.chunk.id, slot);
  return Status::OK();
}

Status Snapshot::WriteRecord(Slot& slot, Bytes raw, const Buffer* base) {
  EncodedPiece piece = EncodePiece(engine_->options_.codec, raw, slot.width, base);
  const bool delta = IsDelta(piece.encoding.transform);
  Buffer joined;
  Bytes payload = raw;
  if (delta) {
    joined = JoinDeltaPayload(slot.base->id, piece.stored.bytes());
    payload = joined.bytes();
  } else if (!piece.stored_raw()) {
    payload = piece.stored.bytes();
  }
  const uint32_t raw_len = static_cast<uint32_t>(raw.size());
  const RecordHeader h = RecordHeader::For(slot.chunk.id, raw_len, piece.encoding, payload);
  std::byte header[kRecordHeaderBytes];
  h.EncodeTo(header);
  const uint64_t length = kRecordHeaderBytes + payload.size();
  const uint64_t offset = pack_end_.fetch_add(length);
  CKPTFS_RETURN_IF_ERROR(
      PWriteFull(pack_fd_.get(), offset, {header, kRecordHeaderBytes}, pack_.path));
  CKPTFS_RETURN_IF_ERROR(
      PWriteFull(pack_fd_.get(), offset + kRecordHeaderBytes, payload, pack_.path));
  slot.chunk.stored = true;
  slot.chunk.offset = offset;
  slot.chunk.length = static_cast<uint32_t>(length);
  slot.record = std::make_shared<const StoredRecord>(
      StoredRecord{slot.chunk.id, raw_len, pack_.pack_id, offset, slot.chunk.length,
                   delta ? slot.base->depth + 1 : 1, delta ? slot.base : nullptr});
  ++records_written_;
  record_bytes_ += length;
  if (delta) ++records_delta_;
  return Status::OK();
}

Status Snapshot::Persist() {
  {
    MutexLock lock(mu_);
    if (!error_.ok()) return error_;
  }
  CKPTFS_RETURN_IF_ERROR(
      StoreChunk(0, reinterpret_cast<const std::byte*>(header_.data()), header_.size()));
  CKPTFS_RETURN_IF_ERROR(DataSync(pack_fd_.get(), pack_.path));
  pack_fd_ = FileDescriptor();
  RankCommit commit;
  commit.file_name = "rank_" + std::to_string(engine_->rank_) + ".safetensors";
  commit.size = header_.size();
  for (const TensorDesc& t : tensors_) commit.size += t.nbytes;
  commit.pack_id = pack_.pack_id;
  commit.pack_length = pack_end_.load();
  commit.chunks.reserve(slots_.size());
  for (const Slot& slot : slots_) commit.chunks.push_back(slot.chunk);
  commit.shard_json = ShardJson(tensors_, commit.file_name, engine_->rank_);
  return engine_->sink_->Commit(commit);
}

// ---- Engine ---------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<PersistSink> sink, int rank, int world_size, const EngineOptions& o)
    : sink_(std::move(sink)), rank_(rank), world_size_(world_size), options_(o) {}

Engine::~Engine() {
  std::shared_ptr<Snapshot> current;
  {
    MutexLock lock(mu_);
    current = std::move(current_);
  }
  if (current) (void)current->Wait();
  pool_.reset();
}

Result<std::unique_ptr<Engine>> Engine::Open(std::unique_ptr<PersistSink> sink, int rank,
                                             int world_size, const EngineOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("rank " + std::to_string(rank) + " of world size " +
                                   std::to_string(world_size));
  }
  EngineOptions o = options;
  if (o.block_bytes == 0 || o.block_bytes > kMaxRecordRawBytes) {
    return Status::InvalidArgument("block size must be 1 byte .. 64 MiB");
  }
  if (o.ring_bytes < o.block_bytes) {
    return Status::InvalidArgument("the staging ring must hold at least one block");
  }
  // Runs of blocks: at most half the ring, so that staging and persisting overlap.
  uint64_t max_run = std::min(o.max_copy_bytes, o.ring_bytes / 2) / o.block_bytes;
  o.max_copy_bytes = std::max<uint64_t>(1, max_run) * o.block_bytes;
  std::unique_ptr<Engine> e(new Engine(std::move(sink), rank, world_size, o));
  if (o.backend != BackendKind::kCpu) {
    auto cuda = NewCudaBackend(o.ring_bytes);
    if (cuda.ok()) {
      e->backend_ = std::move(*cuda);
    } else if (o.backend == BackendKind::kCuda) {
      return cuda.status();
    }
  }
  if (!e->backend_) e->backend_ = NewCpuBackend(o.ring_bytes);
  e->backend_name_ = e->backend_->name();
  e->ring_ = std::make_unique<HostRing>(e->backend_->ring_memory(), o.ring_bytes);
  int threads = o.workers > 0 ? o.workers
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  e->pool_ = std::make_unique<WorkerPool>(threads);
  return e;
}

Result<std::shared_ptr<Snapshot>> Engine::Start(const std::string& version,
                                                std::vector<TensorDesc> tensors,
                                                std::map<std::string, std::string> metadata) {
  MutexLock lock(mu_);
  if (current_) {
    (void)current_->Wait();  // its failure was reported to its own handle
    current_.reset();
  }
  std::shared_ptr<Snapshot> snap(
      new Snapshot(this, version, std::move(tensors), std::move(metadata)));
  snap->driver_ = std::thread([p = snap.get()] { p->Run(); });
  current_ = snap;
  return snap;
}

}  // namespace ckptfs::snapshot
