// engine/namespace/open_inode.h
//
// The bytes of one regular file while it is open, or closed but not yet committed: writes,
// reads of what was written, truncation, and the commit that points the inode at its new
// content. FileSystem keeps one OpenInode per open inode (its handle table, filesystem.cc);
// the Committer (committer.h) calls Commit() in release order. No FUSE here: open_inode_test.cc
// drives it over a Store directly.
//
//   auto f = std::make_shared<OpenInode>(inode, store, staging_dir, new_writer);
//   CKPTFS_RETURN_IF_ERROR(f->Write(0, bytes, /*append=*/false));
//   CKPTFS_RETURN_IF_ERROR(f->Commit());   // durable, and the inode names the new content
//
// Streaming: writes at the end of the file go into a ContentWriter (made by the caller's
// WriterFactory, which picks the delta reference; an appender continues the committed
// content). With a Spool (the default in the daemon), a write only lands in an unnamed spool
// file (O_TMPFILE in the staging directory, page-cache speed) and returns; the Ingester feeds
// the spooled bytes to the writer behind it. The spool's backlog is bounded by the Spool's
// budget (a write waits while it is full). Commit() waits for the ingest, then finishes the
// writer and closes the spool: a spool ingested before the kernel wrote it back costs no disk
// write. Without a Spool the write calls ContentWriter::Append itself.
//
// Ingested spool pages are punched out (fallocate), so a spool holds about the backlog in the
// page cache and its dirty pages are not written back.
//
// Patch path (the documented slower path): the first write anywhere else, or a truncate to a
// non-zero size, copies the bytes so far into an unnamed staging file (O_TMPFILE in the
// staging directory) and continues there; Commit() streams it into the store.
//
// FUSE passthrough (docs/fs.md, "FUSE passthrough"): StartPassthrough() makes an empty file's
// bytes an unnamed staging file that the kernel then writes and reads directly (the FUSE
// adapter registers it as the handle's backing file); this class sees no Write() for them. It
// learns what the kernel wrote from the staging file's size and change time (fine-grained:
// FileSystem checks that the staging directory's filesystem gives them), on every commit and
// read; a commit that ran while a passthrough writer could write concurrently (not under an
// fsync, during which the kernel holds the inode's lock) makes the next one read it all again.
// The staging file stays while passthrough handles are open, and goes with the first commit
// after the last one.
//
// Fsync journal (docs/fs.md, "Fsync journal"): the fsync of a passthrough file may, instead of
// committing, make the kernel's bytes durable where they already are: Journal() fdatasyncs the
// staging file, then names it in the staging directory (JournalName: the inode and the content
// the catalog holds for it, which fences off a journal made stale by a later commit) and syncs
// the directory: data before the name that points at it. The commit still follows (at close,
// sync, unmount) and removes the name; a daemon that dies first finds the journal at the next
// mount (FileSystem::RecoverJournals, AdoptJournal). A commit that fails keeps a journaled
// file's bytes (no sticky error: the fsync told the writer they were safe) for the next one.
//
// Errors: a failed write of streamed bytes is sticky (later writes, reads, Flush and Commit
// report it; the inode keeps its previous content). A failed commit of a staged file leaves
// the staging file, so a later commit may retry.
//
// Lock order: OpenInode::mu, then a catalog write transaction. Thread-safe; the reference_*
// fields belong to FileSystem (see there), as do the file's version and handle count (kept in
// FileSystem's table of open files, under its lock).
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "engine/namespace/ingester.h"
#include "engine/namespace/inode.h"
#include "engine/store/content_writer.h"
#include "engine/store/store.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"
#include "engine/util/worker_pool.h"

namespace ckptfs {

class OpenInode : public IngestTarget, public std::enable_shared_from_this<OpenInode> {
 public:
  // A writer for a new content of this file (the caller chooses its delta reference).
  using WriterFactory = std::function<std::unique_ptr<ContentWriter>(OpenInode&)>;
  // Spooled writes: who ingests them, and the bytes spooled but not yet ingested, shared by
  // all files. Both must outlive the file.
  struct Spool {
    Ingester* ingester = nullptr;
    ByteBudget* backlog = nullptr;
  };

  // REQUIRES: made by std::make_shared (the Ingester holds files it works on).
  OpenInode(const Inode& inode, Store* store, std::filesystem::path staging_dir,
            WriterFactory new_writer, std::optional<Spool> spool = std::nullopt);
  ~OpenInode() override;
  OpenInode(const OpenInode&) = delete;
  OpenInode& operator=(const OpenInode&) = delete;

  // Writes data at offset (at the end when append). ReadOnly once `sealed` is set.
  Status Write(uint64_t offset, Bytes data, bool append);
  // Reads what was written and is not committed yet. When the file holds no bytes of its own
  // (clean: nothing written since the last commit), returns nullopt and sets *committed to the
  // content to read instead (0: the file is empty or all zeros up to size). `out` is clamped
  // to the file's size either way.
  Result<std::optional<size_t>> ReadPending(uint64_t offset, MutableBytes& out,
                                            ContentId* committed);
  // Changes the size (truncate or extend with zeros). ReadOnly once `sealed` is set.
  Status Truncate(uint64_t size);
  // O_TRUNC: empty, and a previous write error forgotten. ReadOnly once `sealed` is set (the
  // file keeps its bytes); other failures are sticky, as a write's.
  Status TruncateForOpen();
  // The error a write (or commit) hit, if any; does not wait for anything.
  Status error();
  // Whether the file holds bytes or times that no finished commit took in (a commit under way
  // is waited for, its on_content_changed call included: a view opened after this returns
  // false finds the kernel's cache of it dropped; a passthrough file's staging file is looked
  // at).
  Result<bool> HasUncommittedChanges();
  // Makes the bytes written so far durable and points the inode at them (one catalog
  // transaction that also releases the content it held). No-op when clean. A missing inode
  // (dropped meanwhile) releases the new content instead.
  Status Commit();

  // Fsync journal (above). True: the bytes are durable in the journal; false: nothing done,
  // the caller commits instead (no passthrough staging file, clean, less free space on the
  // disk than twice the file's size + 256 MiB, or the name could not be made). REQUIRES: under an
  // fsync (fsyncs_in_progress), so that the kernel writes nothing meanwhile.
  Result<bool> Journal();
  // At mount: the journal `name` in the staging directory (open as fd) holds this file's
  // bytes, newer than its committed content; the next Commit() commits them.
  Status AdoptJournal(FileDescriptor fd, std::string name);
  // A journal names bytes of this file that no commit has taken in yet (no lock).
  bool holds_journal() const { return holds_journal_.load(); }
  // The file's size when the journal last took it (no lock).
  uint64_t journaled_bytes() const { return journaled_bytes_.load(); }
  static std::string JournalName(Ino ino, ContentId committed);
  // The inode and committed content of a journal name; nullopt for any other name.
  static std::optional<std::pair<Ino, ContentId>> ParseJournalName(std::string_view name);

  // Passthrough. StartPassthrough: the file (empty, no other passthrough handle, not sealed)
  // keeps its bytes in a new staging file; returns a descriptor of it for the kernel, and
  // counts one passthrough handle. AddPassthroughHandle: another handle shares that file
  // (see below). EndPassthroughHandle: one went (after the kernel's
  // last write through it).
  Result<FileDescriptor> StartPassthrough();
  // False (nothing counted) when the staging file is gone: the last passthrough handle went
  // and a commit dropped it; the caller opens without passthrough then.
  bool AddPassthroughHandle();
  void EndPassthroughHandle();
  // Publishes the backing file's size and mtime to the views (FileSystem::Flush of a
  // passthrough handle: close() waits for it, so a utime() after it stays).
  void RefreshViewFromBacking();
  int passthrough_handles() const { return passthrough_handles_.load(); }
  // FileSystem::Fsync counts itself here while its commit runs: the kernel holds the inode's
  // lock for the whole fsync, so no passthrough write runs meanwhile.
  std::atomic<int> fsyncs_in_progress{0};

  // The Ingester's call: appends spooled bytes to the writer.
  bool IngestSome(MutableBytes scratch) override;

  // Whether a write, truncation or O_TRUNC changed the file after the last Commit() began (no
  // lock). Once no handle is left only Commit() runs on the file, so a file released with
  // such a change has the commit of that release still queued.
  bool changed_since_commit() const { return changes_.load() != committed_changes_.load(); }
  // Size and mtime including uncommitted writes, for GetAttr (no lock but a short one of its
  // own while passthrough handles are open: then they come from the staging file).
  uint64_t size_view();
  int64_t mtime_view();
  // utime() of an open file: the commit binds this mtime.
  // (A passthrough file's backing file takes it too, so that the kernel's writes before it do
  // not bring their own mtime back.)
  void set_mtime_view(int64_t ns);
  // Bytes written since the last commit that made them durable (no lock).
  // (With passthrough handles open, what the staging file grew by since the last look too.)
  uint64_t pending_bytes();
  // Called with the bytes a passthrough file grew by, as this class learns of them (for the
  // daemon's bytes-written counter). Set before the file is shared; null: none.
  std::function<void(uint64_t)> on_kernel_bytes;
  // Called after a commit that gave the inode another content or size (outside the file's
  // lock, on the committing thread): the views derived from it changed. Set before the file is
  // shared; null: none.
  std::function<void(Ino)> on_content_changed;

  const Ino ino;
  // ---- FileSystem's bookkeeping (filesystem.cc) -------------------------------------------
  std::atomic<bool> sealed{false};  // set by Seal(): writes fail with ReadOnly from then on
  // The same file of the previous version (its delta reference), looked up once by
  // FileSystem::ReferenceFile(); the first Write lets it commit first if it is still queued.
  std::once_flag reference_once;
  std::optional<Ino> reference_file;  // written once under reference_once
  std::atomic<bool> reference_settled{false};

 private:
  Status CommitOnce(bool* changed);  // Commit() but the callback
  Status ToStagingLocked() REQUIRES(mu_);
  void TouchLocked() REQUIRES(mu_);  // size_ set: publishes size and mtime
  // Reads [offset, offset + out.size()) of the file as written so far; REQUIRES: not staged,
  // offset + out.size() <= size_.
  Result<size_t> ReadStreamedLocked(uint64_t offset, MutableBytes out) REQUIRES(mu_);
  // Waits until every spooled byte was appended to the writer; returns the ingest's error.
  Status WaitIngestedLocked() REQUIRES(mu_);
  // Drops the writer (its chunks are abandoned) and the spool.
  void DropStreamLocked() REQUIRES(mu_);
  // Takes in what the kernel wrote to a passthrough staging file since the last look (all of
  // it again when `unsure_`): size, mtime, and the file dirty if it changed.
  Status RefreshFromBackingLocked() REQUIRES(mu_);
  // Sets the view's mtime to the backing file's if that changed since it was last published.
  void PublishMtimeLocked(const timespec& mtime) REQUIRES(view_mu_);
  // A commit took the bytes in: the journal's name goes (not synced: a stale journal left by
  // a crash is fenced off by the committed content in its name).
  void RemoveJournalLocked() REQUIRES(mu_);

  Store* const store_;
  const std::filesystem::path staging_dir_;
  const WriterFactory new_writer_;

  // Held by Commit() over the commit and its on_content_changed call, and by
  // HasUncommittedChanges(): who sees the commit done sees its views invalidated. Before mu_.
  Mutex commit_mu_ ACQUIRED_BEFORE(mu_);
  Mutex mu_;
  ContentId base_ GUARDED_BY(mu_);           // committed content the bytes start from
  ContentId committed_ GUARDED_BY(mu_);      // the inode's content in the catalog
  uint64_t committed_size_ GUARDED_BY(mu_);  // and its size there
  uint64_t size_ GUARDED_BY(mu_);
  bool dirty_ GUARDED_BY(mu_) = false;      // differs from the committed inode
  FileDescriptor staging_ GUARDED_BY(mu_);  // staging mode
  Status error_ GUARDED_BY(mu_);            // a write or commit failed; bytes are lost
  // Written under mu_ (TouchLocked), and by EndPassthroughHandle.
  std::atomic<uint64_t> changes_{0};
  std::atomic<uint64_t> committed_changes_{0};  // written under mu_ (Commit)
  std::atomic<uint64_t> pending_bytes_{0};      // written under mu_ (Write, Commit)
  std::atomic<uint64_t> size_view_;
  std::atomic<int64_t> mtime_view_;

  // Passthrough state. backing_: staging_ has been a passthrough backing file since it was
  // made (the kernel may have written it); backing_seen_: its size, mtime and ctime at the
  // last look; unsure_: a commit ran while a passthrough writer could write concurrently.
  bool backing_ GUARDED_BY(mu_) = false;
  struct timespec backing_mtime_ GUARDED_BY(mu_) {};
  struct timespec backing_ctime_ GUARDED_BY(mu_) {};
  uint64_t backing_size_ GUARDED_BY(mu_) = 0;
  bool unsure_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> backing_seen_size_{0};  // size_ at the last RefreshFromBackingLocked
  std::atomic<int> passthrough_handles_{0};
  // The journal: its name in the staging directory ("": none) and the file it names.
  std::string journal_name_ GUARDED_BY(mu_);
  ino_t journal_file_ GUARDED_BY(mu_) = 0;
  std::atomic<bool> holds_journal_{false};
  std::atomic<uint64_t> journaled_bytes_{0};
  Mutex view_mu_;                                     // never held with mu_ taken after it
  FileDescriptor backing_view_ GUARDED_BY(view_mu_);  // a dup of staging_ for GetAttr
  timespec published_mtime_ GUARDED_BY(view_mu_){};   // the backing mtime in mtime_view_
  int64_t passthrough_start_ns_ GUARDED_BY(view_mu_) = 0;

  // The streaming state. writer_, spool_ and spool_start_ change only with both mu_ and
  // ingest_mu_ held, so either lock suffices to read them; the Ingester takes only ingest_mu_
  // (an Append may block on the store's in-flight budget, and writes must not wait for that).
  const std::optional<Spool> spool_config_;
  Mutex ingest_mu_;
  CondVar ingested_cv_;
  std::unique_ptr<ContentWriter> writer_;
  FileDescriptor spool_;  // the spooled bytes: file bytes [spool_start_, spooled_end_)
  uint64_t spool_start_ = 0;
  std::atomic<uint64_t> spooled_end_{0};            // advanced by Write under mu_
  uint64_t ingested_ GUARDED_BY(ingest_mu_) = 0;    // appended up to here
  uint64_t punched_ GUARDED_BY(ingest_mu_) = 0;     // spool offset; pages before it are freed
  bool punch_holes_ GUARDED_BY(ingest_mu_) = true;  // false where fallocate cannot
  Status ingest_error_ GUARDED_BY(ingest_mu_);
  std::atomic<bool> ingest_failed_{false};
};

}  // namespace ckptfs
