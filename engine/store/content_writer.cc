#include "engine/store/content_writer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "engine/store/store.h"

namespace ckptfs {
namespace {

// The chunk id of `piece`. An unchanged piece (a frozen tensor, a state saved again) has its
// delta base's bytes: when those are in the cache, one memcmp (which stops at the first
// difference when the piece has changed) gives its id instead of a SHA-256 over it. Exact as
// long as the cache holds each chunk's bytes under its id, the invariant every read of the
// store already rests on.
ChunkId PieceId(Bytes piece, const std::optional<std::pair<ChunkId, ChunkRow>>& base,
                ChunkCache& cache) {
  if (base && base->second.raw_len == piece.size()) {
    auto cached = cache.Lookup(base->first, /*streamed=*/true);
    if (cached && cached->size() == piece.size() &&
        std::memcmp(cached->data(), piece.data(), piece.size()) == 0) {
      return base->first;
    }
  }
  return ChunkId::Of(piece);
}

}  // namespace

ContentWriter::ContentWriter(Store* store, std::optional<ContentId> base, uint64_t base_size)
    : store_(store),
      base_(base),
      base_size_(base_size),
      cdc_(store->options().chunking),
      piece_bytes_(std::clamp<size_t>(store->options().tensor_piece_bytes, 1,
                                      store->options().chunking.max_size)),
      size_(base_size),
      chunk_start_(base_size) {
  // An appender's bytes do not start a file: only a writer of a whole content has a layout.
  if (base_size == 0 && store->options().format_aware_chunking) scanner_.emplace();
}

Status ContentWriter::SetReference(ContentId previous) {
  if (size_ != 0 || base_) return Status::InvalidArgument("SetReference after the first bytes");
  return LoadReference(previous);
}

void ContentWriter::SetReferenceFinder(ReferenceFinder find) {
  if (size_ == 0 && !base_ && !reference_) finder_ = std::move(find);
}

Status ContentWriter::LoadReference(ContentId previous) {
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentLayout> layout, store_->GetLayout(previous));
  reference_sections_.clear();
  reference_.reset();
  if (!layout || store_->options().max_delta_chain <= 1) return Status::OK();
  for (const LayoutSection& s : layout->sections)
    reference_sections_.emplace(std::string(SectionKey(s.name)), s.start);
  reference_ = previous;
  return Status::OK();
}

ContentWriter::~ContentWriter() {
  if (!finished_) Abandon();
}

Status ContentWriter::Append(Bytes data) {
  {
    MutexLock lock(mu_);
    if (!error_.ok()) return error_;
  }
  while (!data.empty()) {
    // The scanner stops where it learns of a section boundary, which may lie a few bytes back.
    const size_t n = scanner_ ? scanner_->Scan(data) : data.size();
    AppendChunked(data.first(n));
    data = data.subspan(n);
    if (!scanner_) continue;
    if (finder_ && scanner_->signature()) {
      // No tensor piece has been submitted yet: they all come after data.pkl or the header.
      if (std::optional<ContentId> found = finder_(*scanner_->signature())) {
        Status s = LoadReference(*found);
        if (!s.ok()) spdlog::warn("no deltas against content {}: {}", *found, s.ToString());
      }
      finder_ = nullptr;
    }
    if (scanner_->AtBoundary()) {
      std::optional<Piece> next;
      if (const LayoutSection* s = scanner_->section()) next = Piece{s->name, s->start, s->width()};
      CutAt(scanner_->boundary(), std::move(next));
    }
    if (scanner_->done()) {
      layout_ = scanner_->TakeLayout();
      scanner_.reset();
    }
  }
  return Status::OK();
}

void ContentWriter::AppendChunked(Bytes data) {
  const size_t max_size = cdc_.params().max_size;
  while (!data.empty()) {
    size_t n;
    bool cut;
    if (mode_ == CutMode::kContentDefined && piece_) {
      // Fixed pieces from the section's start.
      n = std::min(data.size(), piece_bytes_ - current_.size());
      cut = current_.size() + n == piece_bytes_;
    } else if (mode_ == CutMode::kContentDefined) {
      n = cdc_.Scan(data);
      cut = cdc_.AtCut();
    } else {
      n = std::min(data.size(), max_size - current_.size());
      cut = current_.size() + n == max_size;
    }
    if (current_.capacity() == 0) current_.Reserve(max_size);
    current_.Append(data.first(n));
    size_ += n;
    data = data.subspan(n);
    if (cut) Submit();
  }
}

void ContentWriter::CutAt(uint64_t offset, std::optional<Piece> next) {
  const size_t lag = static_cast<size_t>(size_ - offset);
  std::array<std::byte, LayoutScanner::kMaxBoundaryLag> after;
  if (offset <= chunk_start_ || offset > size_ || lag > after.size()) {
    // A chunk already ends there (or, for an end learned late, a fixed piece ran past it:
    // the bytes after the cut are in a chunk of their own already).
    piece_ = std::move(next);
    return;
  }
  const size_t keep = static_cast<size_t>(offset - chunk_start_);
  std::memcpy(after.data(), current_.data() + keep, lag);
  current_.Resize(keep);
  size_ -= lag;
  Submit();
  piece_ = std::move(next);
  // Fewer than min_size bytes: FastCDC starts the next chunk with them and cannot cut there.
  AppendChunked({after.data(), lag});
}

Status ContentWriter::Cut() {
  if (!current_.empty()) Submit();
  MutexLock lock(mu_);
  return error_;
}

void ContentWriter::Submit() {
  cdc_.Reset();
  Buffer chunk;
  if (current_.size() < current_.capacity() / 2) {
    // A chunk much shorter than the buffer it was filled in (a small tensor, a cut where a
    // record ends) moves to a buffer of its own size, and the writer keeps its buffer. The
    // cache and the in-flight budget count sizes: a 4 KiB bias cached in a 1 MiB buffer pinned
    // 1 MiB, resident once the heap recycles touched pages (fs.sh saves peaked at 606 MiB).
    chunk = Buffer(current_.bytes());
    current_.Clear();
  } else {
    chunk = std::move(current_);
    current_ = Buffer();
  }
  const size_t bytes = chunk.size();
  Slot* slot;
  {
    MutexLock lock(mu_);
    slots_.push_back(Slot{ChunkRef{chunk_start_, ChunkId{}, static_cast<uint32_t>(bytes)}, {}});
    slot = &slots_.back();  // deque: stays valid as more slots are added
    ++pending_;
  }
  // Where the same piece lies in the reference content, if it has the section.
  std::optional<uint64_t> ref_offset;
  uint8_t width = 1;
  if (piece_) {
    width = piece_->width;
    auto it = reference_sections_.find(std::string(SectionKey(piece_->name)));
    if (it != reference_sections_.end()) ref_offset = it->second + (chunk_start_ - piece_->start);
  }
  const bool in_section = piece_.has_value();
  chunk_start_ += bytes;
  store_->inflight_.Acquire(bytes);  // backpressure
  // std::function must be copyable: the task shares ownership of the chunk.
  auto owned = std::make_shared<Buffer>(std::move(chunk));
  store_->pool_->Submit([this, slot, bytes, owned, ref_offset, width, in_section] {
    Store::PieceHint hint;
    hint.width = width;
    hint.encode = encode_at_write_;
    // Tensor pieces of a file that has a predecessor are the next version's delta bases: its
    // writer compares them with its pieces (PieceId) and the re-encoder makes them deltas of
    // them. A file without one (a first version, a single file copied in) is not cached: for
    // the version after it the re-encoder has nothing to do, and the pieces would only grow
    // the heap (on the VMs measured, first touches of fresh pages were ~10% of ingest CPU).
    hint.cache = in_section && reference_.has_value() && store_->options().max_delta_chain > 1;
    if (ref_offset) {
      hint.base = store_->PinDeltaBase(*reference_, *ref_offset, static_cast<uint32_t>(bytes));
    }
    const ChunkId id = PieceId(owned->bytes(), hint.base, store_->cache_);
    if (hint.base && hint.base->first == id) hint.cache = false;  // unchanged: dedup
    Result<ChunkRow> row = store_->PutChunk(id, std::move(*owned), hint);
    store_->inflight_.Release(bytes);
    MutexLock lock(mu_);
    if (hint.base) slot->base = hint.base->first;
    slot->ref.id = id;
    if (row.ok()) {
      slot->row = *row;
      slot->pinned = true;
    } else if (error_.ok()) {
      error_ = row.status();
    }
    if (--pending_ == 0) idle_cv_.NotifyAll();
  });
}

void ContentWriter::WaitIdle(MutexLock& lock) {
  while (pending_ != 0) idle_cv_.Wait(lock);
}

void ContentWriter::Abandon() {
  MutexLock lock(mu_);
  WaitIdle(lock);
  for (const Slot& s : slots_) {
    if (s.pinned) store_->Unpin(s.ref.id);
    if (s.base) store_->Unpin(*s.base);
  }
  slots_.clear();
  finished_ = true;
}

Result<size_t> ContentWriter::ReadBack(uint64_t offset, MutableBytes out) {
  if (offset >= size_ || out.empty()) return size_t{0};
  const size_t want = static_cast<size_t>(std::min<uint64_t>(out.size(), size_ - offset));
  size_t done = 0;
  if (offset < base_size_) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(want, base_size_ - offset));
    CKPTFS_ASSIGN_OR_RETURN(size_t got, store_->Read(*base_, offset, out.first(n)));
    if (got != n) return Status::Corruption("base content is shorter than recorded");
    done = n;
  }
  {
    MutexLock lock(mu_);
    WaitIdle(lock);
  }
  CKPTFS_RETURN_IF_ERROR(store_->packs_->WaitWritten());
  MutexLock lock(mu_);
  CKPTFS_RETURN_IF_ERROR(error_);
  for (const Slot& slot : slots_) {
    if (done == want) break;
    uint64_t pos = offset + done;
    if (pos >= slot.ref.offset + slot.ref.length) continue;
    CKPTFS_ASSIGN_OR_RETURN(auto chunk, store_->LoadChunk(slot.ref.id, slot.row));
    size_t in_chunk = static_cast<size_t>(pos - slot.ref.offset);
    size_t n = std::min(want - done, chunk->size() - in_chunk);
    std::memcpy(out.data() + done, chunk->data() + in_chunk, n);
    done += n;
  }
  if (done < want) {  // the rest is in the chunk still being filled
    uint64_t pos = offset + done;
    size_t n = want - done;
    std::memcpy(out.data() + done, current_.data() + (pos - chunk_start_), n);
    done += n;
  }
  return done;
}

Result<ContentId> ContentWriter::Finish(const CommitHook& hook) {
  if (!current_.empty()) Submit();
  Status err;
  {
    MutexLock lock(mu_);
    WaitIdle(lock);
    err = error_;
  }
  if (!err.ok()) {
    Abandon();
    return err;
  }
  std::vector<Store::CommitRef> refs;
  {
    MutexLock lock(mu_);
    refs.reserve(slots_.size());
    for (const Slot& s : slots_) {
      // A piece stored whole although it had a whole base: the re-encoder reverses the pair.
      std::optional<ChunkId> reverse_base;
      if (s.base && !IsDelta(s.row.transform)) reverse_base = s.base;
      refs.push_back(Store::CommitRef{s.ref, s.row, reverse_base});
    }
  }
  if (scanner_) {
    layout_ = scanner_->TakeLayout();
    scanner_.reset();
  }
  const std::string layout =
      layout_.format != ContentLayout::Format::kNone ? layout_.Encode() : std::string();
  Result<Store::Committed> committed = store_->CommitContent(base_, refs, size_, layout, hook);
  Abandon();  // unpins: the catalog now holds the references (or the commit failed)
  if (!committed.ok()) return committed.status();
  // Queued only now: the re-encoder leaves alone the bases this writer pinned.
  if (committed->reencode) store_->QueueReverseDeltas(committed->id);
  return committed->id;
}

}  // namespace ckptfs
