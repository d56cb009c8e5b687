// FileSystem members for the derived, read-only views (docs/views.md):
//
//   VERSION@bf16/ VERSION@fp16/ VERSION@fp32/   (at the root) the version with every .pt /
//                                               .safetensors file's floating tensors converted
//   FILE@bf16 FILE@fp16 FILE@fp32               (beside any file: a file version's view) the
//                                               file converted
//   FILE@tensors/ FILE@bf16@tensors/ ...        (beside any checkpoint file, also inside a
//                                               precision view) index.json + one .npy per tensor
//   .ckptfs/stats                               (at the root) the daemon's live statistics,
//                                               JSON generated at each open (SetLiveStats)
//
// None of these names is listed by readdir; a real entry of the same name wins. Virtual inode
// numbers have kViewInoBit set and are never reused. A view inode lives while the kernel holds
// a reference to it (FUSE's lookup count: ViewReferenced, ViewForget); of those it holds none
// of, a bounded number are kept (ViewState::Sweep), so the table does not grow with every view
// looked up over a mount's life. Every change through a view fails with EROFS.
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <string>
#include <unordered_map>

#include "engine/namespace/filesystem.h"
#include "engine/util/mutex.h"
#include "engine/views/precision_view.h"
#include "engine/views/tensor_view.h"

namespace ckptfs {
namespace {

constexpr std::string_view kTensorsSuffix = "@tensors";
constexpr std::string_view kLiveDirName = ".ckptfs";
constexpr std::string_view kLiveStatsName = "stats";
// Built views are kept for reuse, at most this many and this many bytes of them (a view is a
// few bytes per tensor and per record; a precision view of a torch file also holds its
// rewritten data.pkl). Open handles keep theirs alive past eviction.
constexpr size_t kMaxCachedViews = 256;
constexpr uint64_t kMaxCachedViewBytes = 64u << 20;
// View inodes the kernel holds no reference to (forgotten, or named only by readdir and
// internal lookups): once there are this many (or twice as many as the last sweep left), those
// unused for kViewNodeIdleNs are dropped. A node in use (found by a lookup that has not yet
// replied) is never that idle.
constexpr size_t kMaxUnreferencedViewNodes = 1024;
constexpr int64_t kViewNodeIdleNs = 1'000'000'000;

struct PrecisionName {
  std::string_view suffix;
  DType dtype;
};
constexpr PrecisionName kPrecisions[] = {
    {"@bf16", DType::kBF16}, {"@fp16", DType::kF16}, {"@fp32", DType::kF32}};

Status Errno(int err, std::string_view what) { return Status::FromErrno(err, what); }

bool IsNotSupported(const Status& s) { return s.code() == Status::Code::kNotSupported; }

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The precision a hidden name ends with (FILE@bf16), if any.
const PrecisionName* PrecisionSuffixOf(std::string_view name) {
  for (const PrecisionName& p : kPrecisions) {
    if (EndsWith(name, p.suffix)) return &p;
  }
  return nullptr;
}

}  // namespace

struct FileSystem::ViewState {
  struct Node {
    enum class Kind : uint8_t {
      kTensorDir,
      kTensorFile,
      kPrecisionDir,
      kPrecisionFile,
      kLiveDir,   // .ckptfs at the root (real: the root)
      kLiveFile,  // .ckptfs/stats
    };
    Kind kind;
    Ino real;                 // the real file (tensor dir/file, precision file) or directory
    std::optional<DType> to;  // the precision, if any
    std::string file;         // kTensorFile: its name in the tensor dir
  };
  // What a content's views are, once built (null: it has none).
  struct Built {
    std::shared_ptr<const TensorView> tensors;
    std::shared_ptr<PrecisionPlan> precision;
    bool tensors_tried = false, precision_tried = false;
    uint64_t memory = 0;  // of what it holds, for the cache's bound
  };
  struct OpenView {
    OpenView(uint64_t readahead, WorkerPool::Priority priority)
        : window(readahead), priority(priority) {}
    std::shared_ptr<const void> keep;  // keeps `file` alive
    const VirtualFile* file = nullptr;
    ContentId content = 0;
    ReadaheadWindow window;  // over the view's bytes
    const WorkerPool::Priority priority;
  };

  // A view inode: its node, the kernel's references (lookup count) and when it was last used
  // (steady clock, ns).
  struct Entry {
    Node node;
    uint64_t refs = 0;
    int64_t used = 0;
  };
  static std::string KeyOf(const Node& n) {  // in node_ids
    return std::to_string(static_cast<int>(n.kind)) + "/" + std::to_string(n.real) + "/" +
           std::to_string(n.to ? static_cast<int>(*n.to) : -1) + "/" + n.file;
  }

  Mutex mu;
  std::unordered_map<Ino, Entry> nodes GUARDED_BY(mu);
  std::unordered_map<std::string, Ino> node_ids GUARDED_BY(mu);
  std::unordered_multimap<Ino, Ino> by_real GUARDED_BY(mu);  // real inode -> its view inodes
  uint64_t next_node GUARDED_BY(mu) = 1;
  size_t unreferenced GUARDED_BY(mu) = 0;  // nodes with refs == 0
  size_t sweep_at GUARDED_BY(mu) = kMaxUnreferencedViewNodes;
  std::map<std::pair<ContentId, int>, Built> built GUARDED_BY(mu);  // (content, precision)
  std::deque<std::pair<ContentId, int>> built_order GUARDED_BY(mu);
  uint64_t built_bytes GUARDED_BY(mu) = 0;  // sum of Built::memory
  std::unordered_map<uint64_t, std::shared_ptr<OpenView>> handles GUARDED_BY(mu);
  uint64_t next_handle GUARDED_BY(mu) = 1;

  Ino NodeFor(const Node& n) {
    std::string key = KeyOf(n);
    MutexLock lock(mu);
    auto it = node_ids.find(key);
    const int64_t now = Now();
    if (it != node_ids.end()) {
      nodes.at(it->second).used = now;
      return it->second;
    }
    if (unreferenced >= sweep_at) Sweep(now);
    const Ino ino = kViewInoBit | next_node++;
    nodes.emplace(ino, Entry{n, 0, now});
    node_ids.emplace(std::move(key), ino);
    by_real.emplace(n.real, ino);
    ++unreferenced;
    return ino;
  }
  Result<Node> Get(Ino ino) {
    MutexLock lock(mu);
    auto it = nodes.find(ino);
    if (it == nodes.end()) return Status::NotFound("view inode " + std::to_string(ino));
    it->second.used = Now();
    return it->second.node;
  }
  bool Reference(Ino ino) {
    MutexLock lock(mu);
    auto it = nodes.find(ino);
    if (it == nodes.end()) return false;
    if (it->second.refs++ == 0) --unreferenced;
    it->second.used = Now();
    return true;
  }
  void Forget(Ino ino, uint64_t n) {
    MutexLock lock(mu);
    auto it = nodes.find(ino);
    if (it == nodes.end() || it->second.refs == 0) return;
    it->second.refs -= std::min(n, it->second.refs);
    if (it->second.refs == 0) ++unreferenced;
  }
  // Drops the unreferenced nodes idle for kViewNodeIdleNs. The next sweep comes when the
  // unreferenced ones have doubled (at least kMaxUnreferencedViewNodes): a scan of the table
  // per that many new nodes. So the unreferenced nodes kept are at most twice those looked up
  // within a second of the last sweep, and at least kMaxUnreferencedViewNodes.
  void Sweep(int64_t now) REQUIRES(mu) {
    for (auto it = nodes.begin(); it != nodes.end();) {
      const Entry& e = it->second;
      if (e.refs != 0 || now - e.used < kViewNodeIdleNs) {
        ++it;
        continue;
      }
      node_ids.erase(KeyOf(e.node));
      auto [first, last] = by_real.equal_range(e.node.real);
      for (auto r = first; r != last; ++r) {
        if (r->second == it->first) {
          by_real.erase(r);
          break;
        }
      }
      --unreferenced;
      it = nodes.erase(it);
    }
    sweep_at = std::max(kMaxUnreferencedViewNodes, 2 * unreferenced);
  }
  static std::pair<ContentId, int> Key(ContentId content, std::optional<DType> to) {
    return {content, to ? static_cast<int>(*to) : -1};
  }
  void EvictOldest() REQUIRES(mu) {  // REQUIRES: built_order not empty
    auto it = built.find(built_order.front());
    if (it != built.end()) {
      built_bytes -= it->second.memory;
      built.erase(it);
    }
    built_order.pop_front();
  }
  Built& Slot(ContentId content, std::optional<DType> to) REQUIRES(mu) {
    const auto key = Key(content, to);
    auto it = built.find(key);
    if (it != built.end()) return it->second;
    while (built_order.size() >= kMaxCachedViews) EvictOldest();
    built_order.push_back(key);
    return built[key];
  }
  // Counts `bytes` more for the slot of (content, to), then evicts older slots while the
  // cache holds more than kMaxCachedViewBytes. REQUIRES: the slot exists.
  void Account(ContentId content, std::optional<DType> to, uint64_t bytes) REQUIRES(mu) {
    const auto key = Key(content, to);
    built[key].memory += bytes;
    built_bytes += bytes;
    while (built_bytes > kMaxCachedViewBytes && built_order.front() != key) EvictOldest();
  }
};

std::shared_ptr<FileSystem::ViewState> FileSystem::MakeViewState() {
  return std::make_shared<ViewState>();
}

SourceReader FileSystem::ContentSource(ContentId content) const {
  return [store = store_, content](uint64_t offset, MutableBytes out) {
    return store->Read(content, offset, out);
  };
}

Result<std::shared_ptr<const TensorView>> FileSystem::TensorViewOf(const Inode& file,
                                                                   std::optional<DType> to) {
  if (!file.is_reg() || file.content == 0) return Status::NotFound("no tensors");
  {
    MutexLock lock(views_->mu);
    ViewState::Built& b = views_->Slot(file.content, to);
    if (b.tensors_tried) {
      if (!b.tensors) return Status::NotFound("no tensor view");
      return b.tensors;
    }
  }
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentLayout> layout, store_->GetLayout(file.content));
  auto view = BuildTensorView(ContentSource(file.content), file.size, layout, to);
  if (!view.ok() && !IsNotSupported(view.status())) return view.status();
  MutexLock lock(views_->mu);
  ViewState::Built& b = views_->Slot(file.content, to);
  b.tensors_tried = true;
  if (!view.ok()) return Status::NotFound("no tensor view");
  b.tensors = *view;
  views_->Account(file.content, to, (*view)->memory_bytes());
  return *view;
}

// The precision plan of a file, or null when the view presents it unchanged.
Result<std::shared_ptr<PrecisionPlan>> FileSystem::PrecisionPlanOf(const Inode& file, DType to) {
  if (!file.is_reg() || file.content == 0) return std::shared_ptr<PrecisionPlan>();
  {
    MutexLock lock(views_->mu);
    ViewState::Built& b = views_->Slot(file.content, to);
    if (b.precision_tried) return b.precision;
  }
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ContentLayout> layout, store_->GetLayout(file.content));
  auto plan = PlanPrecisionView(ContentSource(file.content), file.size, layout, to);
  if (!plan.ok() && !IsNotSupported(plan.status())) return plan.status();
  MutexLock lock(views_->mu);
  ViewState::Built& b = views_->Slot(file.content, to);
  b.precision_tried = true;
  if (!plan.ok()) return std::shared_ptr<PrecisionPlan>();
  b.precision = *plan;
  // Twice the plan: the finished file holds as much again (its pieces, the pickle's copy).
  views_->Account(file.content, to, 2 * (*plan)->memory_bytes());
  return *plan;
}

// The committed inode of a file a view reads. A file closed but not yet committed (close()
// returns first, and the kernel's RELEASE may come after this lookup) is committed now, so
// that a view looked up right after the save sees it; a file still being written (a handle
// written since its last flush) shows its last committed content.
Result<Inode> FileSystem::ViewReal(Ino ino) {
  CKPTFS_RETURN_IF_ERROR(CommitIfClosed(ino));
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store_->catalog().BeginRead());
  return MustGet(txn, ino);
}

Result<Inode> FileSystem::ViewInode(Ino ino) {
  CKPTFS_ASSIGN_OR_RETURN(ViewState::Node node, views_->Get(ino));
  CKPTFS_ASSIGN_OR_RETURN(Inode real, ViewReal(node.real));
  Inode v = real;
  v.ino = ino;
  v.flags = 0;
  v.symlink.clear();
  using Kind = ViewState::Node::Kind;
  switch (node.kind) {
    case Kind::kLiveDir:
      v.mode = S_IFDIR | 0555;
      v.nlink = 2;
      v.size = 0;
      break;
    case Kind::kLiveFile:  // generated at open: no size known before (opened with direct I/O)
      v.mode = S_IFREG | 0444;
      v.nlink = 1;
      v.size = 0;
      break;
    case Kind::kTensorDir:
    case Kind::kPrecisionDir:
      if (node.kind == Kind::kPrecisionDir && !real.is_dir()) return Status::NotFound("gone");
      v.mode = S_IFDIR | 0555;
      v.nlink = 2;
      v.size = 0;
      break;
    case Kind::kTensorFile: {
      CKPTFS_ASSIGN_OR_RETURN(auto view, TensorViewOf(real, node.to));
      const VirtualFile* f = view->Find(node.file);
      if (f == nullptr) return Status::NotFound(node.file);
      v.mode = S_IFREG | 0444;
      v.nlink = 1;
      v.size = f->size();
      break;
    }
    case Kind::kPrecisionFile: {
      if (!real.is_reg()) return Status::NotFound("gone");
      CKPTFS_ASSIGN_OR_RETURN(auto plan, PrecisionPlanOf(real, *node.to));
      v.mode = S_IFREG | 0444;
      v.nlink = 1;
      if (plan) v.size = plan->size();
      break;
    }
  }
  return v;
}

Result<Inode> FileSystem::ViewLookup(Ino parent, std::string_view name) {
  using Kind = ViewState::Node::Kind;
  if (!IsViewIno(parent)) {
    // Hidden names beside real entries: VERSION@bf16 at the root, FILE@bf16 beside any file
    // (a file version's precision view), FILE@tensors and FILE@bf16@tensors; .ckptfs at the
    // root of a mount that serves live statistics.
    if (parent == kRootIno && name == kLiveDirName && live_stats_) {
      return ViewInode(views_->NodeFor({Kind::kLiveDir, kRootIno, std::nullopt, ""}));
    }
    if (const PrecisionName* p = PrecisionSuffixOf(name)) {
      CKPTFS_ASSIGN_OR_RETURN(Inode real,
                              Lookup(parent, name.substr(0, name.size() - p->suffix.size())));
      if (IsViewIno(real.ino)) return Status::NotFound(std::string(name));
      if (real.is_dir() && parent == kRootIno) {
        return ViewInode(views_->NodeFor({Kind::kPrecisionDir, real.ino, p->dtype, ""}));
      }
      if (real.is_reg()) {
        return ViewInode(views_->NodeFor({Kind::kPrecisionFile, real.ino, p->dtype, ""}));
      }
      return Status::NotFound(std::string(name));
    }
    if (EndsWith(name, kTensorsSuffix)) {
      CKPTFS_ASSIGN_OR_RETURN(Inode found,
                              Lookup(parent, name.substr(0, name.size() - kTensorsSuffix.size())));
      if (IsViewIno(found.ino)) {
        // FILE@bf16@tensors: the file and the precision from the name (the precision file's
        // node, which no kernel reference holds, may be dropped by now: views.cc's top).
        const std::string_view base = name.substr(0, name.size() - kTensorsSuffix.size());
        const PrecisionName* p = PrecisionSuffixOf(base);
        if (p == nullptr) return Status::NotFound(std::string(name));
        CKPTFS_ASSIGN_OR_RETURN(Inode real,
                                Lookup(parent, base.substr(0, base.size() - p->suffix.size())));
        if (IsViewIno(real.ino) || !real.is_reg()) return Status::NotFound(std::string(name));
        CKPTFS_ASSIGN_OR_RETURN(Inode file, ViewReal(real.ino));
        CKPTFS_RETURN_IF_ERROR(TensorViewOf(file, p->dtype).status());
        return ViewInode(views_->NodeFor({Kind::kTensorDir, file.ino, p->dtype, ""}));
      }
      CKPTFS_ASSIGN_OR_RETURN(Inode file, ViewReal(found.ino));
      CKPTFS_RETURN_IF_ERROR(TensorViewOf(file, std::nullopt).status());
      return ViewInode(views_->NodeFor({Kind::kTensorDir, file.ino, std::nullopt, ""}));
    }
    return Status::NotFound(std::string(name));
  }
  CKPTFS_ASSIGN_OR_RETURN(ViewState::Node node, views_->Get(parent));
  if (node.kind == Kind::kLiveDir) {
    if (name != kLiveStatsName) return Status::NotFound(std::string(name));
    return ViewInode(views_->NodeFor({Kind::kLiveFile, kRootIno, std::nullopt, ""}));
  }
  if (node.kind == Kind::kTensorDir) {
    CKPTFS_ASSIGN_OR_RETURN(Inode file, ViewReal(node.real));
    CKPTFS_ASSIGN_OR_RETURN(auto view, TensorViewOf(file, node.to));
    if (view->Find(name) == nullptr) return Status::NotFound(std::string(name));
    return ViewInode(views_->NodeFor({Kind::kTensorFile, node.real, node.to, std::string(name)}));
  }
  if (node.kind != Kind::kPrecisionDir) return Errno(ENOTDIR, "lookup in a view file");
  if (EndsWith(name, kTensorsSuffix)) {
    auto found = Lookup(node.real, name.substr(0, name.size() - kTensorsSuffix.size()));
    if (found.ok() && !IsViewIno(found->ino)) {
      CKPTFS_ASSIGN_OR_RETURN(Inode file, ViewReal(found->ino));
      CKPTFS_RETURN_IF_ERROR(TensorViewOf(file, node.to).status());
      return ViewInode(views_->NodeFor({Kind::kTensorDir, file.ino, node.to, ""}));
    }
  }
  auto child = Lookup(node.real, name);
  if (child.ok() && !IsViewIno(child->ino) && child->is_dir()) {
    return ViewInode(views_->NodeFor({Kind::kPrecisionDir, child->ino, node.to, ""}));
  }
  if (child.ok() && !IsViewIno(child->ino) && child->is_reg()) {
    return ViewInode(views_->NodeFor({Kind::kPrecisionFile, child->ino, node.to, ""}));
  }
  if (!child.ok() && !child.status().IsNotFound()) return child.status();
  return Status::NotFound(std::string(name));
}

Result<uint64_t> FileSystem::ViewOpen(Ino ino, int flags) {
  using Kind = ViewState::Node::Kind;
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)) {
    return Status::ReadOnly("views are read-only");
  }
  CKPTFS_ASSIGN_OR_RETURN(ViewState::Node node, views_->Get(ino));
  CKPTFS_ASSIGN_OR_RETURN(Inode real, ViewReal(node.real));
  // A reader that opens with O_DIRECT asks for exactly the ranges it wants (ckptfs.lazy_load's
  // get_slice reads a range of rows): no prefetch beyond them (docs/views.md).
  const uint64_t readahead = (flags & O_DIRECT) ? 0 : options_.readahead_bytes;
  auto open = std::make_shared<ViewState::OpenView>(readahead, PrefetchPriorityOf(node.real));
  open->content = real.content;
  if (node.kind == Kind::kTensorFile) {
    CKPTFS_ASSIGN_OR_RETURN(auto view, TensorViewOf(real, node.to));
    open->file = view->Find(node.file);
    if (open->file == nullptr) return Status::NotFound(node.file);
    open->keep = view;
  } else if (node.kind == Kind::kLiveFile) {
    auto text = std::make_shared<VirtualFile>();
    text->AddBytes(live_stats_());
    open->file = text.get();
    open->keep = std::move(text);
  } else if (node.kind == Kind::kPrecisionFile) {
    CKPTFS_ASSIGN_OR_RETURN(auto plan, PrecisionPlanOf(real, *node.to));
    std::shared_ptr<const VirtualFile> file;
    if (plan) {
      CKPTFS_ASSIGN_OR_RETURN(file, plan->Finish(ContentSource(real.content)));
    } else {
      auto copy = std::make_shared<VirtualFile>();  // presented unchanged
      if (real.content != 0) copy->AddCopy(0, real.size);
      file = std::move(copy);
    }
    open->file = file.get();
    open->keep = file;
  } else {
    return Errno(EISDIR, "open");
  }
  MutexLock lock(views_->mu);
  const uint64_t fh = kViewHandleBit | views_->next_handle++;
  views_->handles.emplace(fh, std::move(open));
  return fh;
}

Result<size_t> FileSystem::ViewRead(uint64_t fh, uint64_t offset, MutableBytes out) {
  std::shared_ptr<ViewState::OpenView> open;
  {
    MutexLock lock(views_->mu);
    auto it = views_->handles.find(fh);
    if (it == views_->handles.end()) return Errno(EBADF, "view handle");
    open = it->second;
  }
  Result<size_t> read = open->file->Read(offset, out, ContentSource(open->content));
  if (!read.ok() && read.status().IsNotFound()) {
    // The content this handle reads was released: its file was rewritten or removed since the
    // view was opened (a regular handle reads the new content; a view's layout is the old one).
    return Errno(ESTALE,
                 "the file was rewritten or removed while its view was open; open it again");
  }
  CKPTFS_ASSIGN_OR_RETURN(size_t n, std::move(read));
  // Sequential readers get the next readahead_bytes of this file's own source ranges
  // prefetched: never bytes of tensors the reader does not ask for.
  const auto [from, len] = open->window.Advance(offset, n);
  if (len > 0) {
    open->file->SourceRanges(from, len, [&](uint64_t at, uint64_t bytes) {
      store_->Prefetch(open->content, at, bytes, open->priority);
    });
  }
  return n;
}

void FileSystem::ViewsChanged(Ino real) {
  using Kind = ViewState::Node::Kind;
  std::vector<Ino> changed;
  {
    MutexLock lock(views_->mu);
    auto [first, last] = views_->by_real.equal_range(real);
    for (auto it = first; it != last; ++it) {
      const ViewState::Node& n = views_->nodes.at(it->second).node;
      if (n.kind != Kind::kLiveDir && n.kind != Kind::kLiveFile && n.kind != Kind::kPrecisionDir) {
        changed.push_back(it->second);
      }
    }
  }
  MutexLock lock(on_view_changed_mu_);
  if (!on_view_changed_) return;
  for (Ino ino : changed) on_view_changed_(ino);
}

bool FileSystem::ViewReferenced(Ino ino) { return views_->Reference(ino); }

void FileSystem::ViewForget(Ino ino, uint64_t n) { views_->Forget(ino, n); }

size_t FileSystem::ViewNodes() const {
  MutexLock lock(views_->mu);
  return views_->nodes.size();
}

Status FileSystem::ViewRelease(uint64_t fh) {
  MutexLock lock(views_->mu);
  return views_->handles.erase(fh) == 1 ? Status::OK() : Errno(EBADF, "view handle");
}

bool FileSystem::IsGeneratedFile(Ino ino) {
  if (!IsViewIno(ino)) return false;
  auto node = views_->Get(ino);
  return node.ok() && node->kind == ViewState::Node::Kind::kLiveFile;
}

Result<std::vector<DirEntry>> FileSystem::ViewListDir(Ino ino) {
  using Kind = ViewState::Node::Kind;
  CKPTFS_ASSIGN_OR_RETURN(ViewState::Node node, views_->Get(ino));
  std::vector<DirEntry> entries;
  if (node.kind == Kind::kLiveDir) {
    entries.push_back({std::string(kLiveStatsName),
                       views_->NodeFor({Kind::kLiveFile, kRootIno, std::nullopt, ""}),
                       S_IFREG | 0444});
    return entries;
  }
  if (node.kind == Kind::kTensorDir) {
    CKPTFS_ASSIGN_OR_RETURN(Inode file, ViewReal(node.real));
    CKPTFS_ASSIGN_OR_RETURN(auto view, TensorViewOf(file, node.to));
    entries.push_back({"index.json",
                       views_->NodeFor({Kind::kTensorFile, node.real, node.to, "index.json"}),
                       S_IFREG | 0444});
    for (const TensorView::Entry& e : view->tensors) {
      entries.push_back({e.file, views_->NodeFor({Kind::kTensorFile, node.real, node.to, e.file}),
                         S_IFREG | 0444});
    }
    return entries;
  }
  if (node.kind != Kind::kPrecisionDir) return Errno(ENOTDIR, "opendir");
  CKPTFS_ASSIGN_OR_RETURN(uint64_t dh, OpenDir(node.real));
  std::vector<DirEntry> real;
  Status s = ReadDir(dh, 0, [&](const DirEntry& e, uint64_t) {
    real.push_back(e);
    return true;
  });
  ReleaseDir(dh);
  CKPTFS_RETURN_IF_ERROR(s);
  for (const DirEntry& e : real) {
    if (S_ISDIR(e.mode)) {
      entries.push_back(
          {e.name, views_->NodeFor({Kind::kPrecisionDir, e.ino, node.to, ""}), S_IFDIR | 0555});
    } else if (S_ISREG(e.mode)) {
      entries.push_back(
          {e.name, views_->NodeFor({Kind::kPrecisionFile, e.ino, node.to, ""}), S_IFREG | 0444});
    }
  }
  return entries;
}

}  // namespace ckptfs
