// engine/store/content_writer.h
//
// Streams one content into the store. Append() cuts the bytes into chunks (FastCDC, or only
// where the caller says in kCallerOnly mode) and queues each chunk for hashing, dedup and
// compression on the store's worker pool; Append() blocks while the store's in-flight budget
// is full (backpressure), so memory stays bounded however fast the caller writes.
//
//   auto w = store->NewWriter();
//   w->SetCutMode(ContentWriter::CutMode::kCallerOnly);   // format-aware callers
//   CKPTFS_RETURN_IF_ERROR(w->Append(header));
//   CKPTFS_RETURN_IF_ERROR(w->Cut());                     // a chunk ends here
//   CKPTFS_ASSIGN_OR_RETURN(ContentId id, w->Finish());
//
// In kContentDefined mode, with the store's format_aware_chunking, a writer that starts a
// content (not an appender) learns the file's layout as it streams (format/layout.h): chunks
// end wherever a section (a torch.save zip record, a safetensors tensor) starts and ends, a
// section is cut into fixed pieces of StoreOptions::tensor_piece_bytes counted from its start,
// and each piece carries its element width (byte planes). Bytes outside sections, and files of
// no known format, are cut by FastCDC. Chunks depend only on the bytes, not on how Append()
// splits them. The layout is committed with the content.
//
// SetReference(previous) names the same file in the previous version: a piece whose section
// (by name) and offset within it match a chunk of the same length there may be stored as a
// delta against that chunk (Store: max_delta_chain).
//
// SetReferenceFinder(find) is for a file that has no such predecessor: once the layout scanner
// knows the file's LayoutSignature (after data.pkl or the safetensors header, before any tensor
// piece), find(signature) may name a content to use as the reference, as SetReference would.
//
// Finish() waits for the pipeline, makes the records durable and commits the content; a hook
// runs inside that same catalog transaction (to bind the content to a name or inode). A writer
// destroyed without Finish() abandons its content: nothing becomes visible.
//
// A writer made by Store::NewAppender(base) continues an existing content: the new content is
// base's bytes followed by what is appended (base itself is left as it is). ReadBack() reads
// what has been written so far, committed or not.
// Thread-compatible: one thread drives a writer.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include "engine/chunk/fastcdc.h"
#include "engine/format/layout.h"
#include "engine/store/catalog.h"
#include "engine/util/buffer.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {

class Store;

class ContentWriter {
 public:
  enum class CutMode {
    kContentDefined,  // FastCDC boundaries, plus the caller's Cut()s
    kCallerOnly,      // only the caller's Cut()s, and the maximum chunk size
  };
  using CommitHook = std::function<Status(Catalog::WriteTxn&, ContentId)>;

  ~ContentWriter();
  ContentWriter(const ContentWriter&) = delete;
  ContentWriter& operator=(const ContentWriter&) = delete;

  // Deltas against `previous` (see above). REQUIRES: before the first Append.
  Status SetReference(ContentId previous);
  // See above. REQUIRES: before the first Append; no effect once a reference is set.
  using ReferenceFinder = std::function<std::optional<ContentId>(uint64_t signature)>;
  void SetReferenceFinder(ReferenceFinder find);
  Status Append(Bytes data);
  // Ends the current chunk here (no-op at a chunk boundary).
  Status Cut();
  // kCallerOnly also ends format-aware cuts for the rest of the content.
  void SetCutMode(CutMode mode) {
    mode_ = mode;
    if (mode != CutMode::kContentDefined) scanner_.reset();
  }
  // Pieces are encoded as they are stored even where the store compresses whole pieces behind
  // the writer (StoreOptions::compress_behind): for a writer nobody waits on (the commit of a
  // file that FUSE passthrough wrote, after its close or fsync journal), which then writes no
  // raw records that the re-encoder reads back and replaces. REQUIRES: before the first Append.
  void EncodeAtWrite() { encode_at_write_ = true; }
  uint64_t size() const { return size_; }
  // Reads bytes [offset, offset + out.size()) of what was written so far; short at the end.
  // Waits for queued chunks to be stored first.
  Result<size_t> ReadBack(uint64_t offset, MutableBytes out);
  // REQUIRES: not yet finished. On error the content is abandoned.
  Result<ContentId> Finish(const CommitHook& hook = nullptr);

 private:
  friend class Store;
  struct Slot {
    ChunkRef ref;
    ChunkRow row;
    bool pinned = false;
    std::optional<ChunkId> base;  // a pinned delta base candidate
  };
  // The section the chunk being filled belongs to.
  struct Piece {
    std::string name;
    uint64_t start = 0;  // of the section
    uint8_t width = 1;
  };
  ContentWriter(Store* store, std::optional<ContentId> base, uint64_t base_size);
  // Cuts in mode_ (FastCDC or the maximum size), appending to current_.
  void AppendChunked(Bytes data);
  // Ends the current chunk at `offset`, at most LayoutScanner::kMaxBoundaryLag bytes before
  // size_; the bytes after it start the next chunk, which belongs to `next` (a section, or
  // none). Only switches sections if a chunk already ends at or after `offset`.
  void CutAt(uint64_t offset, std::optional<Piece> next);
  void Submit();
  // Takes `previous`'s layout as the reference's (SetReference without its precondition).
  Status LoadReference(ContentId previous);
  // Returns once no task is pending (releasing `lock` while it waits).
  void WaitIdle(MutexLock& lock) REQUIRES(mu_);
  void Abandon();

  Store* const store_;
  const std::optional<ContentId> base_;
  const uint64_t base_size_;
  FastCdc cdc_;
  const size_t piece_bytes_;
  std::optional<LayoutScanner> scanner_;  // while format-aware cuts may still come
  ContentLayout layout_;                  // once the scanner is done
  std::optional<Piece> piece_;            // the section of the chunk being filled
  std::optional<ContentId> reference_;
  ReferenceFinder finder_;                                        // until the signature is known
  std::unordered_map<std::string, uint64_t> reference_sections_;  // SectionKey -> start
  CutMode mode_ = CutMode::kContentDefined;
  bool encode_at_write_ = false;
  Buffer current_;
  uint64_t size_ = 0;
  uint64_t chunk_start_ = 0;
  bool finished_ = false;

  Mutex mu_;
  CondVar idle_cv_;
  // Each task fills its own slot (through a pointer, under mu_).
  std::deque<Slot> slots_ GUARDED_BY(mu_);
  size_t pending_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
