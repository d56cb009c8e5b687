#include "engine/store/pack_writer.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace ckptfs {
namespace {
constexpr unsigned kRingDepth = 64;
constexpr uint64_t kWritebackBytes = 8 << 20;
}  // namespace

struct PackWriter::InflightWrite {
  uint32_t pack_id = 0;
  uint64_t offset = 0;
  std::shared_ptr<FileDescriptor> fd;
  std::byte header[kRecordHeaderBytes + kChunkIdBytes];  // the record header, then a delta's base
  size_t header_len = kRecordHeaderBytes;
  std::shared_ptr<const Buffer> payload;  // a record's (null for a segment)
  // A full segment of a direct pack (header_len 0), written through `fd` (O_DIRECT); a short
  // write is finished through `buffered`.
  Buffer segment;
  size_t segment_from = 0;  // the segment's bytes before this are on disk: not written again
  std::shared_ptr<FileDescriptor> buffered;
  bool writeback_only = false;  // a sync_file_range request, not a record
  iovec iov[2];
  Bytes bytes() const { return payload ? payload->bytes() : segment.bytes().subspan(segment_from); }
  size_t total() const { return header_len + bytes().size(); }
  // What the queue holds in memory: a codec's output buffer may be far larger than the
  // payload in it (sized for the raw chunk, holding a delta of a fifth of it).
  size_t memory() const {
    return header_len + (payload ? payload->capacity() : segment.capacity());
  }
};

namespace {
// Writes the record's bytes from `done` on with pwrite (short writes retried).
Status PWriteRest(int fd, uint64_t offset, Bytes header, Bytes payload, size_t done,
                  const std::filesystem::path& path) {
  if (done < header.size()) {
    CKPTFS_RETURN_IF_ERROR(PWriteFull(fd, offset + done, header.subspan(done), path));
    done = header.size();
  }
  return PWriteFull(fd, offset + done, payload.subspan(done - header.size()), path);
}
}  // namespace

PackWriter::PackWriter(std::filesystem::path dir, Options options)
    : dir_(std::move(dir)), options_(options) {}

PackWriter::~PackWriter() {
  MutexLock lock(mu_);
  for (uint32_t id : active_) {
    if (id == 0) continue;
    // Best effort, as the writes through the page cache were: the tail reaches the file.
    PackState& st = State(id);
    if (FlushTail(st).ok() && st.direct)
      (void)::ftruncate(st.fd->get(), static_cast<off_t>(st.length));
  }
  if (uring_ok_) {
    (void)WaitAllInflight();
    io_uring_queue_exit(&ring_);
  }
}

Result<std::unique_ptr<PackWriter>> PackWriter::Open(const std::filesystem::path& dir,
                                                     const Options& options,
                                                     const std::vector<PackExtent>& resume,
                                                     uint32_t next_id) {
  std::unique_ptr<PackWriter> w(new PackWriter(dir, options));
  MutexLock lock(w->mu_);
  if (options.use_io_uring) {
    int rc = io_uring_queue_init(kRingDepth, &w->ring_, 0);
    if (rc == 0) {
      w->uring_ok_ = true;
    } else {
      spdlog::info("io_uring unavailable ({}); pack writes use pwrite", std::strerror(-rc));
    }
  }
  w->next_id_ = next_id;
  for (const PackExtent& pack : resume) {
    if (pack.length < options.target_bytes && w->active_[static_cast<size_t>(pack.lane)] == 0) {
      CKPTFS_RETURN_IF_ERROR(w->StartPack(pack.pack_id, pack.lane, pack.length));
    }
  }
  return w;
}

Status PackWriter::StartPack(uint32_t id, PackLane lane, std::optional<uint64_t> resume_length) {
  PackState st;
  st.id = id;
  st.lane = lane;
  st.path = dir_ / PackFileName(id);
  int flags = O_RDWR | (resume_length ? 0 : O_CREAT | O_EXCL);
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(st.path, flags));
  st.fd = std::make_shared<FileDescriptor>(std::move(fd));
  if (options_.direct_io) {
    auto direct = OpenFile(st.path, O_WRONLY | O_DIRECT);
    if (direct.ok()) st.direct = std::make_shared<FileDescriptor>(std::move(*direct));
  }
  if (resume_length) {
    st.length = st.synced = *resume_length;
    if (st.direct) {
      const uint64_t from = AlignDownForDirectIo(*resume_length);
      Buffer tail(static_cast<size_t>(*resume_length - from));
      CKPTFS_RETURN_IF_ERROR(PReadFull(st.fd->get(), from, tail.mutable_bytes(), st.path));
      CKPTFS_RETURN_IF_ERROR(StartSegment(st, *resume_length, tail.bytes(), /*on_disk=*/true));
    }
  } else {
    std::byte header[kPackHeaderBytes];
    EncodePackHeader(id, header, lane);
    Status s = StartSegment(st, kPackHeaderBytes, {header, kPackHeaderBytes}, /*on_disk=*/false);
    if (s.ok() && !st.direct) s = PWriteFull(st.fd->get(), 0, {header, kPackHeaderBytes}, st.path);
    if (s.ok()) s = DataSync(st.fd->get(), st.path);
    if (s.ok()) s = SyncDir(dir_);
    if (!s.ok()) {
      ::unlink(st.path.c_str());
      return s;
    }
    st.length = st.synced = kPackHeaderBytes;
  }
  if (id >= next_id_) next_id_ = id + 1;
  last_direct_ = st.direct != nullptr;
  packs_[id] = std::move(st);
  active_[static_cast<size_t>(lane)] = id;
  return Status::OK();
}

// Direct: the segment starts at the block that holds the pack's end. A new pack's (its header)
// is written with O_DIRECT at once, which tells whether this filesystem takes direct writes;
// if it refuses them (EINVAL), the page cache it is. A resumed pack's tail is on disk already
// and stays as the open cut it (no padding); should its first direct write be refused, that
// write fails, and the next record starts a new pack, which probes again.
Status PackWriter::StartSegment(PackState& st, uint64_t length, Bytes tail, bool on_disk) {
  if (!st.direct) return Status::OK();
  st.seg = NewSegment();
  st.seg_offset = AlignDownForDirectIo(length);
  st.seg.Resize(length - st.seg_offset);
  std::memcpy(st.seg.data(), tail.data(), tail.size());
  st.length = length;
  st.seg_written = length;
  if (on_disk) return Status::OK();
  // The probe: a refusal is no failed write of the pack (FlushTail would record one).
  Status s = WritePaddedTail(st);
  if (s.ok() || s.ToErrno() != EINVAL) return s;
  spdlog::info("{}: no O_DIRECT writes here ({}); writing through the page cache", st.path.string(),
               s.ToString());
  st.direct.reset();
  st.seg = Buffer();
  return Status::OK();
}

Buffer PackWriter::NewSegment() {
  Buffer seg;
  if (!free_segments_.empty()) {
    seg = std::move(free_segments_.back());
    free_segments_.pop_back();
  } else {
    seg = Buffer::InAlignedBlock(kDirectIoAlignment, kSegmentBytes, 0, kSegmentBytes);
  }
  seg.Resize(0);
  return seg;
}

Status PackWriter::AppendToSegments(PackState& st, Bytes bytes) {
  while (!bytes.empty()) {
    if (st.seg.capacity() == 0) st.seg = NewSegment();
    const size_t used = st.seg.size();
    const size_t n = std::min(kSegmentBytes - used, bytes.size());
    st.seg.Resize(used + n);
    std::memcpy(st.seg.data() + used, bytes.data(), n);
    st.length += n;
    bytes = bytes.subspan(n);
    if (st.seg.size() < kSegmentBytes) continue;
    auto write = std::make_unique<InflightWrite>();
    write->pack_id = st.id;
    write->offset = UnwrittenFrom(st);
    write->segment_from = static_cast<size_t>(write->offset - st.seg_offset);
    write->fd = st.direct;
    write->buffered = st.fd;
    write->header_len = 0;
    write->segment = std::move(st.seg);
    st.seg = Buffer();
    st.seg_offset += kSegmentBytes;
    st.seg_written = std::max(st.seg_written, st.seg_offset);
    CKPTFS_RETURN_IF_ERROR(SubmitWrite(std::move(write)));
  }
  return Status::OK();
}

Status PackWriter::WritePaddedTail(PackState& st) {
  const size_t filled = st.seg.size();  // == st.length - st.seg_offset, < kSegmentBytes
  const size_t padded = static_cast<size_t>(AlignUpForDirectIo(filled));
  st.seg.Resize(padded);
  std::memset(st.seg.data() + filled, 0, padded - filled);
  const uint64_t from = UnwrittenFrom(st);
  Status s = PWriteFull(st.direct->get(), from,
                        st.seg.bytes().subspan(static_cast<size_t>(from - st.seg_offset)), st.path);
  st.seg.Resize(filled);
  return s;
}

Status PackWriter::FlushTail(PackState& st) {
  if (!st.direct || st.length <= st.seg_written) return Status::OK();
  Status s = WritePaddedTail(st);
  if (!s.ok()) {
    st.failed_at = std::min(st.failed_at, std::max(st.seg_offset, st.synced));
    last_error_ = s;
    return s;
  }
  st.seg_written = st.length;
  return Status::OK();
}

bool PackWriter::using_direct_io() const {
  MutexLock lock(mu_);
  return last_direct_;
}

Result<PackLocation> PackWriter::Append(const RecordHeader& header, Buffer payload,
                                        const std::optional<ChunkId>& delta_base, PackLane lane) {
  return Append(header, std::make_shared<const Buffer>(std::move(payload)), delta_base, lane);
}

Result<PackLocation> PackWriter::Append(const RecordHeader& header,
                                        std::shared_ptr<const Buffer> payload,
                                        const std::optional<ChunkId>& delta_base, PackLane lane) {
  if (payload == nullptr) return Status::InvalidArgument("record without a payload buffer");
  const size_t header_len = kRecordHeaderBytes + (delta_base ? kChunkIdBytes : 0);
  if (header.stored_len != header_len - kRecordHeaderBytes + payload->size()) {
    return Status::InvalidArgument("record header does not match its payload's length");
  }
  MutexLock lock(mu_);
  if (uring_ok_) CKPTFS_RETURN_IF_ERROR(Reap(false));
  uint32_t& active = active_[static_cast<size_t>(lane)];
  PackState* st = active ? &State(active) : nullptr;
  size_t total = header_len + payload->size();
  bool full = st && st->length + total > options_.target_bytes && st->length > kPackHeaderBytes;
  if (!st || full || st->failed_at != UINT64_MAX) {
    if (st) CKPTFS_RETURN_IF_ERROR(ClosePack(active));
    CKPTFS_RETURN_IF_ERROR(StartPack(next_id_, lane, std::nullopt));
    st = &State(active);
  }
  PackLocation loc{st->id, st->length, static_cast<uint32_t>(total)};
  if (st->direct) {
    std::byte head[kRecordHeaderBytes + kChunkIdBytes];
    header.EncodeTo(head);
    if (delta_base) std::memcpy(head + kRecordHeaderBytes, delta_base->bytes.data(), kChunkIdBytes);
    CKPTFS_RETURN_IF_ERROR(AppendToSegments(*st, {head, header_len}));
    CKPTFS_RETURN_IF_ERROR(AppendToSegments(*st, payload->bytes()));
    return loc;
  }
  auto write = std::make_unique<InflightWrite>();
  write->pack_id = st->id;
  write->offset = st->length;
  write->fd = st->fd;
  header.EncodeTo(write->header);
  if (delta_base)
    std::memcpy(write->header + kRecordHeaderBytes, delta_base->bytes.data(), kChunkIdBytes);
  write->header_len = header_len;
  write->payload = std::move(payload);
  st->length += total;
  CKPTFS_RETURN_IF_ERROR(SubmitWrite(std::move(write)));
  return loc;
}

Status PackWriter::SubmitWrite(std::unique_ptr<InflightWrite> write) {
  if (uring_ok_) {
    while (inflight_ >= kRingDepth ||
           (queued_bytes_ > 0 && queued_bytes_ + write->memory() > options_.queue_bytes)) {
      CKPTFS_RETURN_IF_ERROR(Reap(true));
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe != nullptr) {
      unsigned n = 0;
      if (write->header_len > 0) write->iov[n++] = {write->header, write->header_len};
      const Bytes payload = write->bytes();
      // The kernel only reads from the payload: const_cast for iovec's non-const pointer.
      if (!payload.empty())
        write->iov[n++] = {const_cast<std::byte*>(payload.data()), payload.size()};
      io_uring_prep_writev(sqe, write->fd->get(), write->iov, n, write->offset);
      queued_bytes_ += write->memory();
      io_uring_sqe_set_data(sqe, write.release());  // owned by the ring until Reap()
      ++inflight_;
      // The entry is queued now: if this submit fails (EAGAIN), the next one sends it.
      (void)io_uring_submit(&ring_);
      return Status::OK();
    }
  }
  // pwrite path (also when the ring has no free entry).
  Status s = PWriteRest(write->fd->get(), write->offset, {write->header, write->header_len},
                        write->bytes(), 0, State(write->pack_id).path);
  Complete(write.get(), s.ok() ? static_cast<int>(write->total()) : -s.ToErrno());
  if (!s.ok()) last_error_ = s;
  return s;
}

Status PackWriter::Reap(bool wait_one) {
  io_uring_cqe* cqe = nullptr;
  for (int tries = 0; wait_one; ++tries) {
    // Submits whatever is still queued, then waits for a completion.
    int rc = io_uring_submit_and_wait(&ring_, 1);
    if (rc >= 0 && io_uring_peek_cqe(&ring_, &cqe) == 0) break;
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      // In-flight buffers are left allocated: the kernel may still use them.
      return Status::FromErrno(-rc, "io_uring wait");
    }
    if (tries > 1000) return Status::IOError("io_uring makes no progress");
    if (rc < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  while ((cqe != nullptr) || io_uring_peek_cqe(&ring_, &cqe) == 0) {
    auto* write = static_cast<InflightWrite*>(io_uring_cqe_get_data(cqe));
    int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    cqe = nullptr;
    --inflight_;
    std::unique_ptr<InflightWrite> owned(write);
    if (write->writeback_only) continue;  // a hint: its result does not matter
    queued_bytes_ -= write->memory();
    if (res >= 0 && static_cast<size_t>(res) < write->total()) {
      // Short write: finish it synchronously (a segment's rest may be unaligned: through the
      // page cache).
      const int fd = write->buffered ? write->buffered->get() : write->fd->get();
      Status s = PWriteRest(fd, write->offset, {write->header, write->header_len}, write->bytes(),
                            static_cast<size_t>(res), State(write->pack_id).path);
      res = s.ok() ? static_cast<int>(write->total()) : -s.ToErrno();
    }
    if (res < 0) {
      last_error_ = Status::FromErrno(-res, "write pack " + State(write->pack_id).path.string());
    }
    Complete(write, res);
  }
  return Status::OK();
}

void PackWriter::Complete(InflightWrite* write, int result) {
  PackState& st = State(write->pack_id);
  // Two spare segments keep a steady stream of full ones going; more would only sit idle.
  if (write->segment.capacity() > 0 && free_segments_.size() < 2) {
    free_segments_.push_back(std::move(write->segment));
  }
  if (result >= 0) {
    if (st.fd == write->fd) StartWriteback(st, write->offset + write->total());
    return;
  }
  // A segment begins at a block boundary: records before it in its first block were synced.
  const uint64_t failed = write->buffered ? std::max(write->offset, st.synced) : write->offset;
  if (failed < st.failed_at) {
    st.failed_at = failed;
    spdlog::error("pack {} write at offset {} failed: {}; later records go to a new pack",
                  st.path.string(), write->offset, std::strerror(-result));
  }
}

void PackWriter::StartWriteback(PackState& st, uint64_t end) {
  if (end < st.writeback_from + kWritebackBytes) return;
  const uint64_t from = st.writeback_from;
  st.writeback_from = end;
  if (uring_ok_) {
    if (inflight_ >= kRingDepth) return;  // a hint only: never overfill the ring
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;
    auto hint = std::make_unique<InflightWrite>();
    hint->writeback_only = true;
    hint->fd = st.fd;
    io_uring_prep_sync_file_range(sqe, st.fd->get(), static_cast<unsigned>(end - from), from,
                                  SYNC_FILE_RANGE_WRITE);
    io_uring_sqe_set_data(sqe, hint.release());  // owned by the ring until Reap()
    ++inflight_;
    (void)io_uring_submit(&ring_);
    return;
  }
  (void)::sync_file_range(st.fd->get(), static_cast<off_t>(from), static_cast<off_t>(end - from),
                          SYNC_FILE_RANGE_WRITE);
}

Status PackWriter::WaitAllInflight() {
  while (inflight_ > 0) CKPTFS_RETURN_IF_ERROR(Reap(true));
  return Status::OK();
}

Status PackWriter::WaitWritten() {
  MutexLock lock(mu_);
  for (uint32_t id : active_) {
    if (id != 0) CKPTFS_RETURN_IF_ERROR(FlushTail(State(id)));
  }
  if (uring_ok_) CKPTFS_RETURN_IF_ERROR(WaitAllInflight());
  return Status::OK();
}

Status PackWriter::Sync() {
  struct ToSync {
    std::shared_ptr<FileDescriptor> fd;
    uint32_t id = 0;
    uint64_t length = 0;
    std::filesystem::path path;
  };
  // A lane whose pack failed (records past the failure are never durable; its next Append
  // starts a new pack) does not keep the other lanes' records from being synced: the caller
  // checks each record with IsDurable; the first error is returned.
  std::vector<ToSync> to_sync;
  Status failed;
  {
    MutexLock lock(mu_);
    for (uint32_t id : active_) {
      if (id == 0) continue;
      Status s = FlushTail(State(id));
      if (failed.ok()) failed = s;
    }
    Status reaped = uring_ok_ ? WaitAllInflight() : Status::OK();
    if (!reaped.ok()) return reaped;
    for (uint32_t id : active_) {
      if (id == 0) continue;
      PackState& st = State(id);
      // A failed pack is synced too: its records before the failure can still be durable.
      if (st.synced < st.length) to_sync.push_back(ToSync{st.fd, st.id, st.length, st.path});
      if (st.failed_at != UINT64_MAX && failed.ok()) failed = last_error_;
    }
  }
  // Outside the lock: appends go on while the packs sync.
  for (const ToSync& p : to_sync) {
    Status s = DataSync(p.fd->get(), p.path);
    MutexLock lock(mu_);
    PackState& st = State(p.id);
    if (!s.ok()) {
      st.failed_at = std::min(st.failed_at, st.synced);
      last_error_ = s;
      if (failed.ok()) failed = s;
      continue;
    }
    st.synced = std::max(st.synced, p.length);
  }
  return failed;
}

bool PackWriter::IsDurable(const PackLocation& loc) const {
  MutexLock lock(mu_);
  auto it = packs_.find(loc.pack_id);
  if (it == packs_.end()) return false;
  const PackState& st = it->second;
  uint64_t end = loc.offset + loc.length;
  return end <= st.synced && end <= st.failed_at;
}

Status PackWriter::PunchDead(uint32_t pack_id,
                             const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  // Bytes below stable_end are on disk for good: a pack this writer appended to, up to what is
  // synced (later writes of its tail leave the bytes before it as they are); any other, all.
  uint64_t stable_end = UINT64_MAX;
  {
    MutexLock lock(mu_);
    // Logged before the bytes change, so that PunchedSince never misses one under way.
    for (const auto& [from, to] : ranges) {
      // Widened to PunchRange's blocks: it may zero the rest of either edge's.
      punches_.push_back(Punch{++punch_seq_, pack_id, from / kPunchBlock * kPunchBlock,
                               (to + kPunchBlock - 1) / kPunchBlock * kPunchBlock});
      if (punches_.size() > kPunchLog) punches_.pop_front();
    }
    auto it = packs_.find(pack_id);
    if (it != packs_.end()) {
      PackState& st = it->second;
      stable_end = std::min(st.synced, st.failed_at);
      if (st.seg.size() > 0) {  // the tail in memory: its dead bytes are zeros from now on
        const uint64_t seg_end = st.seg_offset + st.seg.size();
        for (const auto& [from, to] : ranges) {
          const uint64_t a = std::max(from, st.seg_offset), b = std::min(to, seg_end);
          if (a < b) std::memset(st.seg.data() + (a - st.seg_offset), 0, b - a);
        }
      }
    }
  }
  const std::filesystem::path path = dir_ / PackFileName(pack_id);
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor file, OpenFile(path, O_RDWR | O_CLOEXEC));
  for (const auto& [from, to] : ranges) {
    CKPTFS_RETURN_IF_ERROR(PunchRange(file.get(), from, to, stable_end, path));
  }
  return Status::OK();
}

uint64_t PackWriter::punch_seq() const {
  MutexLock lock(mu_);
  return punch_seq_;
}

bool PackWriter::PunchedSince(uint64_t seq, uint32_t pack_id, uint64_t from, uint64_t to) const {
  MutexLock lock(mu_);
  if (punch_seq_ == seq) return false;
  if (punches_.empty() || punches_.front().seq > seq + 1) return true;  // the log lost some
  for (auto it = punches_.rbegin(); it != punches_.rend() && it->seq > seq; ++it) {
    if (it->pack_id == pack_id && it->from < to && from < it->to) return true;
  }
  return false;
}

Status PackWriter::Rotate() {
  MutexLock lock(mu_);
  Status first;
  for (uint32_t& id : active_) {
    if (id == 0) continue;
    Status s = ClosePack(id);
    if (first.ok()) first = s;
  }
  return first;
}

Status PackWriter::ClosePack(uint32_t& active) {
  PackState& st = State(active);
  Status flushed = FlushTail(st);
  if (uring_ok_) CKPTFS_RETURN_IF_ERROR(WaitAllInflight());
  active = 0;
  if (st.seg.capacity() > 0) free_segments_.push_back(std::move(st.seg));
  st.seg = Buffer();
  if (!flushed.ok()) return flushed;
  if (st.synced < st.length) {
    Status s = DataSync(st.fd->get(), st.path);
    if (!s.ok()) {
      st.failed_at = std::min(st.failed_at, st.synced);
      last_error_ = s;
      return s;
    }
    st.synced = st.length;
  }
  // The padding of the last block goes (a reader never reads past a record's end).
  if (st.direct) (void)::ftruncate(st.fd->get(), static_cast<off_t>(st.length));
  st.direct.reset();
  st.fd.reset();  // in-flight writes hold their own reference
  return Status::OK();
}

uint32_t PackWriter::ReserveId() {
  MutexLock lock(mu_);
  return next_id_++;
}

std::vector<PackExtent> PackWriter::active_extents() const {
  MutexLock lock(mu_);
  std::vector<PackExtent> out;
  for (uint32_t id : active_) {
    if (id == 0) continue;
    const PackState& st = packs_.at(id);
    out.push_back(PackExtent{id, st.length, st.lane});
  }
  return out;
}

}  // namespace ckptfs
