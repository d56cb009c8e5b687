#include "engine/store/content_writer.h"

#include "engine/store/store.h"

namespace ckptfs {

ContentWriter::ContentWriter(Store* store) : store_(store), cdc_(store->options().chunking) {}

ContentWriter::~ContentWriter() {
  if (!finished_) Abandon();
}

Status ContentWriter::Append(Bytes data) {
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return error_;
  }
  const size_t max_size = cdc_.params().max_size;
  while (!data.empty()) {
    size_t n;
    bool cut;
    if (mode_ == CutMode::kContentDefined) {
      n = cdc_.Scan(data);
      cut = cdc_.AtCut();
    } else {
      n = std::min(data.size(), max_size - current_.size());
      cut = current_.size() + n == max_size;
    }
    if (current_.capacity() == 0) current_.Reserve(std::min(max_size, size_t{1} << 20));
    current_.Append(data.first(n));
    size_ += n;
    data = data.subspan(n);
    if (cut) Submit();
  }
  return Status::OK();
}

Status ContentWriter::Cut() {
  if (!current_.empty()) Submit();
  std::lock_guard lock(mu_);
  return error_;
}

void ContentWriter::Submit() {
  cdc_.Reset();
  Buffer chunk = std::move(current_);
  current_ = Buffer();
  const size_t bytes = chunk.size();
  Slot* slot;
  {
    std::lock_guard lock(mu_);
    slots_.push_back(Slot{ChunkRef{chunk_start_, ChunkId{}, static_cast<uint32_t>(bytes)}, {}});
    slot = &slots_.back();  // deque: stays valid as more slots are added
    ++pending_;
  }
  chunk_start_ += bytes;
  store_->inflight_.Acquire(bytes);  // backpressure
  // std::function must be copyable: the task shares ownership of the chunk.
  auto owned = std::make_shared<Buffer>(std::move(chunk));
  store_->pool_->Submit([this, slot, bytes, owned] {
    ChunkId id = ChunkId::Of(owned->bytes());
    Result<ChunkRow> row = store_->PutChunk(id, owned->bytes());
    *owned = Buffer();
    store_->inflight_.Release(bytes);
    std::lock_guard lock(mu_);
    slot->ref.id = id;
    if (row.ok()) {
      slot->row = *row;
      slot->pinned = true;
    } else if (error_.ok()) {
      error_ = row.status();
    }
    if (--pending_ == 0) idle_cv_.notify_all();
  });
}

void ContentWriter::WaitIdle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return pending_ == 0; });
}

void ContentWriter::Abandon() {
  WaitIdle();
  for (const Slot& s : slots_) {
    if (s.pinned) store_->Unpin(s.ref.id);
  }
  slots_.clear();
  finished_ = true;
}

Result<ContentId> ContentWriter::Finish(const CommitHook& hook) {
  if (!current_.empty()) Submit();
  WaitIdle();
  Status err;
  {
    std::lock_guard lock(mu_);
    err = error_;
  }
  if (!err.ok()) {
    Abandon();
    return err;
  }
  std::vector<std::pair<ChunkRef, ChunkRow>> refs;
  refs.reserve(slots_.size());
  for (const Slot& s : slots_) refs.emplace_back(s.ref, s.row);
  Result<ContentId> id = store_->CommitContent(refs, size_, hook);
  Abandon();  // unpins: the catalog now holds the references (or the commit failed)
  return id;
}

}  // namespace ckptfs
