// engine/namespace/filesystem.h
//
// The POSIX filesystem over a Store: a persistent namespace (inodes and directory entries in
// the catalog, inode numbers stable across remounts), the write path and the read path. The
// FUSE adapter (fs/) translates requests into these calls and nothing else.
//
//   auto fs = FileSystem::Open(store.get(), FileSystemOptions{});
//   auto [inode, fh] = *(*fs)->Create(kRootIno, "latest", 0644, O_WRONLY, caller);
//   CKPTFS_RETURN_IF_ERROR((*fs)->Write(fh, 0, bytes));
//   CKPTFS_RETURN_IF_ERROR((*fs)->Release(fh));   // returns before the data is durable
//   CKPTFS_RETURN_IF_ERROR((*fs)->Sync());        // now it is
//
// Write path. The bytes of an open file live in an OpenInode (open_inode.h: streaming, the
// staging patch path, commit); this class keeps the handle table. A file is committed when
// its last handle is released (asynchronously, in release order, by the Committer,
// committer.h), on Fsync() (waits), and on Sync() (waits for everything). Reads of a file
// being written see what was written.
//
// Units: filesystem.cc (namespace, handles, reads, xattrs), sealing.cc (Seal, the sealer
// thread), external_version.cc, views.cc.
//
// Deltas. A file written into a version is delta-encoded against the file at the same path in
// the previous version (the top-level directory created before its own), see Store.
//
// Versions. Each directory directly under the root is a version; in a directory marked for
// file versions each checkpoint file is a version of its own (file_versions.h). A sealed
// version refuses changes with ReadOnly (EROFS), except unlink and rmdir, so that `rm -rf`
// deletes it. Versions are sealed by Seal() or automatically (FileSystemOptions::seal_after).
// Hard links are refused (NotSupported -> EPERM at the FUSE layer).
// Thread-safe.
#pragma once

#include <sys/statvfs.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/namespace/committer.h"
#include "engine/namespace/fs_metrics.h"
#include "engine/namespace/inode.h"
#include "engine/namespace/open_inode.h"
#include "engine/store/content_reader.h"
#include "engine/store/content_writer.h"
#include "engine/store/store.h"
#include "engine/util/mutex.h"
#include "engine/views/precision_view.h"
#include "engine/views/tensor_view.h"

namespace ckptfs {

struct FileSystemOptions {
  // Bytes loaded ahead of a sequential reader.
  uint64_t readahead_bytes = 8 << 20;
  // Seal a version once a newer version exists and none of its files has been open for this
  // long. Zero disables automatic sealing.
  std::chrono::milliseconds seal_after{std::chrono::seconds(10)};
  // Writes at the end of a file land in an unnamed spool file and are ingested behind the
  // writer (open_inode.h, docs/fs.md); at most this many bytes, all files together, wait in
  // spools for ingest (a write waits while more do). 0: no spool, writes are ingested on the
  // calling thread.
  uint64_t spool_backlog_bytes = 1ull << 30;
  int ingest_threads = 1;
  // Runs after Fsync() and Sync() made their data durable in the store, before they return;
  // its error is theirs. The object store backend publishes to its bucket here, so that
  // durability means "in the bucket" (engine/objstore/bucket_mirror.h, docs/scale-out.md).
  // Unset: nothing more.
  std::function<Status()> after_durable;
  // The fsync of a passthrough file makes its bytes durable in a journal (the staging file,
  // synced and named) and leaves the commit to close, sync or unmount (open_inode.h, docs/fs.md
  // "Fsync journal"). Not with after_durable: there durable means published.
  bool fsync_journal = true;
};

struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
};

struct SetAttrRequest {
  std::optional<uint32_t> mode;  // permission bits only
  std::optional<uint32_t> uid, gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns, mtime_ns;  // already resolved from UTIME_NOW
};

class FileSystem {
 public:
  static Result<std::unique_ptr<FileSystem>> Open(Store* store, const FileSystemOptions& options);
  // Commits every open file (as Sync()) and stops the background threads.
  ~FileSystem();
  FileSystem(const FileSystem&) = delete;
  FileSystem& operator=(const FileSystem&) = delete;

  Result<Inode> Lookup(Ino parent, std::string_view name);
  // For an open file, size and times reflect writes not yet committed.
  Result<Inode> GetAttr(Ino ino);
  Result<Inode> SetAttr(Ino ino, const SetAttrRequest& request);
  Result<Inode> Mkdir(Ino parent, std::string_view name, uint32_t mode, const Caller& caller);
  Result<Inode> Symlink(Ino parent, std::string_view name, std::string_view target,
                        const Caller& caller);
  Result<std::string> Readlink(Ino ino);
  Status Unlink(Ino parent, std::string_view name);
  Status Rmdir(Ino parent, std::string_view name);
  // flags: 0 or RENAME_NOREPLACE. Moving a directory into another version is EXDEV.
  Status Rename(Ino parent, std::string_view name, Ino new_parent, std::string_view new_name,
                unsigned flags);

  // Open files. A handle (fh) is valid until Release().
  Result<std::pair<Inode, uint64_t>> Create(Ino parent, std::string_view name, uint32_t mode,
                                            int flags, const Caller& caller);
  Result<uint64_t> Open(Ino ino, int flags);
  Result<size_t> Read(uint64_t fh, uint64_t offset, MutableBytes out);
  // Read without a copy: appends slices holding up to `length` bytes at offset (shared decoded
  // chunks where the file is clean; else one buffer the bytes were read into); returns their
  // total. The slices keep their bytes alive (a FUSE reply is sent straight from them).
  Result<size_t> ReadSlices(uint64_t fh, uint64_t offset, size_t length,
                            std::vector<ChunkSlice>* out);
  Status Write(uint64_t fh, uint64_t offset, Bytes data);
  // Reports an error that a write of this file already hit; does not wait for durability.
  Status Flush(uint64_t fh);
  Status Fsync(uint64_t fh);
  Status Release(uint64_t fh);

  // FUSE passthrough (open_inode.h, docs/fs.md "FUSE passthrough"); the FUSE adapter keeps
  // the kernel's side (backing ids). PassthroughEligible: the handle may become the first
  // passthrough handle of its file: opened for writing, the file's only handle, empty, not
  // sealed, and the staging directory's filesystem keeps fine-grained change times.
  // StartPassthrough makes it one (a descriptor of the file the kernel is to use);
  // JoinPassthrough counts another handle of a file that has some (false: it has none any
  // more, open without). A passthrough handle's Release tells the file.
  bool PassthroughEligible(uint64_t fh);
  Result<FileDescriptor> StartPassthrough(uint64_t fh);
  bool JoinPassthrough(uint64_t fh);
  // StartPassthrough's handle will not pass through after all (the kernel refused its file):
  // it stops counting as one; the file keeps its bytes in the staging file.
  void AbandonPassthrough(uint64_t fh);
  // Whether the staging directory's filesystem gives every change a new ctime (checked once).
  bool passthrough_possible() const { return fine_change_times_; }

  // Directory listings are snapshots taken at OpenDir.
  Result<uint64_t> OpenDir(Ino ino);
  // Entries from position `offset` on (excluding . and ..); fn gets the next offset.
  // fn must not call back into the FileSystem.
  Status ReadDir(uint64_t dh, uint64_t offset,
                 const std::function<bool(const DirEntry&, uint64_t next)>& fn);
  void ReleaseDir(uint64_t dh);

  // Control attributes (not listed): setting user.ckptfs.seal on a version seals it, setting
  // user.ckptfs.sync anywhere runs Sync() and waits for the store's re-encoder, user.ckptfs.gc runs
  // Sync() then the store's Gc(); user.ckptfs.sealed reads "1" or "0" for anything in a version,
  // user.ckptfs.pid the serving process, user.ckptfs.stats logical and stored bytes. The CLI's
  // seal/sync/umount/gc use them.
  Status SetXattr(Ino ino, std::string_view name, std::string_view value, int flags);
  Result<std::string> GetXattr(Ino ino, std::string_view name);
  Result<std::vector<std::string>> ListXattr(Ino ino);
  Status RemoveXattr(Ino ino, std::string_view name);
  Result<struct statvfs> StatFs();

  // Returns once everything accepted so far (including open files' bytes) is durable.
  Status Sync();
  // Seals the version `ino` (a top-level directory, or a file version: file_versions.h),
  // committing its open files first.
  Status Seal(Ino ino);

  // ---- What the daemon reports (docs/cli.md "stats", "status") ----------------------------
  const FsMetrics& metrics() const { return metrics_; }
  // The write backlog now: commits queued (or running) on the committer, and the bytes that
  // write() accepted and that are not durable yet (in open files, or closed with their commit
  // still queued). A failed commit's bytes count as gone (the writer was told). Journaled:
  // files whose fsync the fsync journal answered and that no commit has taken in yet, and
  // their size at that fsync (durable, not yet in the store).
  struct Backlog {
    uint64_t queued_commits = 0;
    uint64_t pending_bytes = 0;
    uint64_t journaled_files = 0;
    uint64_t journaled_bytes = 0;
  };
  Backlog WriteBacklog();
  // The live statistics file MNT/.ckptfs/stats (not listed; read-only; generated at each
  // open). REQUIRES: called before the first request is served.
  void SetLiveStats(std::function<std::string()> source) { live_stats_ = std::move(source); }
  // Runs after each version's seal (explicit or automatic), on the sealing thread, with only
  // on_sealed_mu_ held (fn must not seal): the mount's retention (retention.h). Null: none.
  void SetOnSealed(std::function<void()> fn) {
    MutexLock lock(on_sealed_mu_);
    on_sealed_ = std::move(fn);
  }
  // Runs with the inode of each view (views.cc) derived from a file whose commit gave it
  // another content or size, on the committing thread, with only on_view_changed_mu_ held:
  // the mount tells the kernel to drop what it caches of them (attributes, pages), which it
  // would otherwise keep for the attribute timeout. Null: none.
  void SetOnViewChanged(std::function<void(Ino)> fn) {
    MutexLock lock(on_view_changed_mu_);
    on_view_changed_ = std::move(fn);
  }
  // Whether `ino` is a file whose bytes are generated at open (the kernel must not cache them,
  // and its reported size is 0: open it with direct I/O).
  bool IsGeneratedFile(Ino ino);

  // ---- Versions written outside FUSE (engine/namespace/external_version.cc) ---------------
  // One file of such a version: its chunks, checked by Store::CheckExternalPack.
  struct ExternalFile {
    std::string name;
    uint64_t size = 0;
    uint32_t pack_id = 0;
    uint64_t pack_length = 0;  // 0: the file has no records of its own
    std::vector<Store::AdoptedChunk> chunks;
  };
  // Publishes the sealed version `name` (a new top-level directory) holding `files` and a
  // manifest.json with `manifest`, all in one catalog transaction: it appears complete or
  // not at all. AlreadyExists if the name is taken.
  Status AddExternalVersion(std::string_view name, const std::vector<ExternalFile>& files,
                            std::string_view manifest, const Caller& owner);
  // OK when `name` could be such a version (valid and not taken).
  Status CheckVersionNameFree(std::string_view name);
  // ---- end of external_version.cc ---------------------------------------------------------

  // ---- Derived read-only views (engine/namespace/views.cc, docs/views.md) -----------------
  // Virtual inodes and handles of views have these bits set; real ones never do.
  static constexpr Ino kViewInoBit = Ino{1} << 62;
  static constexpr uint64_t kViewHandleBit = uint64_t{1} << 62;
  static bool IsViewIno(Ino ino) { return (ino & kViewInoBit) != 0; }
  static bool IsViewHandle(uint64_t fh) { return (fh & kViewHandleBit) != 0; }
  // The kernel's references to view inodes (FUSE's lookup count). The mount calls
  // ViewReferenced for each view inode a lookup found, before its reply; false: the inode was
  // dropped since the lookup found it (look up again). ViewForget: the kernel let go of n
  // references. A view inode lives while referenced; of the others only a bounded number are
  // kept (views.cc), so a mount's view table does not grow with every name ever looked up.
  bool ViewReferenced(Ino ino);
  void ViewForget(Ino ino, uint64_t n);
  // View inodes held now, referenced or not (the daemon's stats).
  size_t ViewNodes() const;
  // ---- end of views ----------------------------------------------------------------------

 private:
  // Per-handle read state: the reader (with its prefetch window) of the committed content.
  struct ReadAhead {
    Mutex mu;
    std::shared_ptr<ContentReader> reader GUARDED_BY(mu);
  };
  struct Handle {
    std::shared_ptr<OpenInode> file;
    int flags = 0;
    std::shared_ptr<ReadAhead> read_ahead = std::make_shared<ReadAhead>();
    bool passthrough = false;
    // Changed the file since its last FLUSH (a write, O_TRUNC, or passthrough: the kernel's
    // writes are not seen). close() returns after FLUSH; the kernel's RELEASE comes later, so
    // a handle that is flushed and not written since is closed as far as its writer knows.
    bool unflushed = false;
  };

  FileSystem(Store* store, const FileSystemOptions& options);
  // On a file's first write (or passthrough start): commits its delta reference if that was
  // closed with its commit still queued. Without the file's lock.
  void SettleReference(OpenInode& f);
  // Marks handle `fh` as passthrough or not (off: the file counts one passthrough handle less).
  void MarkPassthrough(uint64_t fh, bool on);
  void MarkUnflushed(uint64_t fh, bool unflushed);
  Status Init();
  Result<Inode> MustGet(const Catalog::ReadTxn& txn, Ino ino);
  Status CheckWritable(const Catalog::ReadTxn& txn, const Inode& inode);
  Result<Inode> MakeNode(Ino parent, std::string_view name, uint32_t mode, const Caller& caller,
                         std::string_view symlink);
  // Removes a name; drops the inode unless it is open. Leaves open_mu_ locked in open_lock
  // so that the caller commits before anyone can open the inode.
  Status RemoveEntry(Catalog::WriteTxn& txn, Ino parent, std::string_view name, const Inode& child)
      REQUIRES(open_mu_);
  Status DropInode(Catalog::WriteTxn& txn, const Inode& inode);
  // The open state of `ino` (made from the catalog if there is none), with one more handle.
  Result<std::shared_ptr<OpenInode>> OpenInodeFor(Ino ino);
  Result<uint64_t> AddHandle(std::shared_ptr<OpenInode> file, int flags);
  Result<Handle> GetHandle(uint64_t fh);
  Result<size_t> ReadOnce(const Handle& h, uint64_t offset, size_t length,
                          std::vector<ChunkSlice>* out, int attempt);
  // A writer for a new content of `ino`, with the same path in the previous version (the
  // version created before ino's) as its delta reference.
  std::unique_ptr<ContentWriter> NewFileWriter(OpenInode& f);
  // The content at ino's path (relative to its version) in the previous version, if any.
  // f's delta reference: PreviousVersionFile(f.ino), looked up once per open file.
  std::optional<Ino> ReferenceFile(OpenInode& f);
  // The file at the same path in the newest older version, if any.
  std::optional<Ino> PreviousVersionFile(Ino ino);
  // The committed content of a regular file, if it has one.
  std::optional<ContentId> CommittedContent(std::optional<Ino> file);
  // The committer's on_released: forgets the open file unless it was opened again, and drops
  // the inode if it was unlinked meanwhile.
  void ForgetReleased(const std::shared_ptr<OpenInode>& file);
  // sealing.cc
  Status CommitAndMarkSealed(Ino ino, const std::vector<std::shared_ptr<OpenInode>>& files);
  void RunSealer();
  // Seals every file version (file_versions.h) that a newer one in its directory follows and
  // that has been idle for seal_after.
  void SealIdleFileVersions(std::chrono::system_clock::time_point now);
  // A file of version (or file version) `ino` has passthrough handles (sealing.cc).
  bool HasPassthroughWriterLocked(Ino ino) REQUIRES(open_mu_);

  // Restore order: reads of optimizer-state files (a name that contains "optim", as DeepSpeed's
  // *_optim_states.pt and HF's optimizer.pt do) prefetch at WorkerPool::Priority::kLow, so
  // that the model's parameters load first. Names are learned as the kernel looks them up.
  static bool IsOptimizerStateName(std::string_view name);
  void NoteLookup(Ino ino, std::string_view name);
  WorkerPool::Priority PrefetchPriorityOf(Ino ino);
  Mutex priority_mu_;
  std::unordered_set<Ino> optimizer_inos_ GUARDED_BY(priority_mu_);  // bounded, see NoteLookup

  // ---- Views (engine/namespace/views.cc) --------------------------------------------------
  struct ViewState;
  static std::shared_ptr<ViewState> MakeViewState();
  SourceReader ContentSource(ContentId content) const;
  Result<std::shared_ptr<const TensorView>> TensorViewOf(const Inode& file,
                                                         std::optional<DType> to);
  Result<std::shared_ptr<PrecisionPlan>> PrecisionPlanOf(const Inode& file, DType to);
  Result<Inode> ViewReal(Ino ino);
  // Commits `ino` now (and waits) if it is open, and every handle of it is closed as its writer
  // sees it: released, read-only, or flushed and not written since.
  Status CommitIfClosed(Ino ino);  // in filesystem.cc
  Result<Inode> ViewInode(Ino ino);
  // A hidden name under a real directory, or any name under a view directory. NotFound if none.
  Result<Inode> ViewLookup(Ino parent, std::string_view name);
  Result<uint64_t> ViewOpen(Ino ino, int flags);
  Result<size_t> ViewRead(uint64_t fh, uint64_t offset, MutableBytes out);
  Status ViewRelease(uint64_t fh);
  Result<std::vector<DirEntry>> ViewListDir(Ino ino);
  // A commit changed file `real`: on_view_changed_ for each view looked up from it.
  void ViewsChanged(Ino real);
  const std::shared_ptr<ViewState> views_ = MakeViewState();
  // ---- end of views ----------------------------------------------------------------------

  Store* const store_;
  const FileSystemOptions options_;
  const std::filesystem::path staging_dir_;

  // Lock order: an OpenInode's lock, then the catalog write transaction, then open_mu_.
  Mutex open_mu_;
  // An open file, while it has handles or a commit of it is queued (ForgetReleased).
  struct OpenFile {
    std::shared_ptr<OpenInode> file;
    Ino version = 0;  // of the file's version (Rename moves it)
    int handles = 0;
  };
  std::unordered_map<Ino, OpenFile> open_files_ GUARDED_BY(open_mu_);
  std::unordered_map<uint64_t, Handle> handles_ GUARDED_BY(open_mu_);
  std::unordered_map<uint64_t, std::vector<DirEntry>> dir_handles_ GUARDED_BY(open_mu_);
  std::map<Ino, std::chrono::steady_clock::time_point> version_activity_ GUARDED_BY(open_mu_);
  std::set<Ino> sealing_ GUARDED_BY(open_mu_);  // versions whose Seal() is in progress
  uint64_t next_handle_ GUARDED_BY(open_mu_) = 1;
  bool fine_change_times_ = false;  // set by Init()
  // Journals a daemon left (open_inode.h): each becomes its file's pending content, committed
  // in the background. Runs in Open(), before anything is served.
  Status RecoverJournals();

  FsMetrics metrics_;
  std::function<std::string()> live_stats_;  // set before serving, then read-only
  Mutex on_sealed_mu_;
  std::function<void()> on_sealed_ GUARDED_BY(on_sealed_mu_);
  Mutex on_view_changed_mu_;
  std::function<void(Ino)> on_view_changed_ GUARDED_BY(on_view_changed_mu_);

  std::unique_ptr<Committer> committer_;
  std::unique_ptr<ByteBudget> spool_backlog_;  // when spooling
  std::unique_ptr<Ingester> ingester_;         // when spooling

  Mutex sealer_mu_;
  CondVar sealer_cv_;
  bool sealer_stopping_ GUARDED_BY(sealer_mu_) = false;
  std::thread sealer_;
};

}  // namespace ckptfs
