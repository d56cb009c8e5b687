// powercut_fs: a crash-simulating FUSE passthrough for the power-loss tests (issue 15).
//
//   powercut_fs LIVE MOUNTPOINT --journal DIR --out DIR [--mode drop|subset] [--seed N]
//
// Serves LIVE at MOUNTPOINT (every operation passes through to LIVE) and keeps, beside it in
// the journal directory (same filesystem as LIVE), what a disk would still hold after a power
// cut:
//   - file data: per file, the content as of its last fsync/fdatasync (a "base" file) and the
//     writes, truncations and hole punches made since (a log, data included, in order);
//   - directory entries: per directory, the names as of its last fsync (POSIX: a name is
//     durable once its directory is synced, not when the file is).
// Everything in LIVE at startup counts as durable. SIGUSR1 cuts the power: in-flight
// operations finish, later ones never complete, the surviving state is written to --out as
// a plain directory tree, a summary line goes to stdout, and the process exits 0 (the mount is
// then dead: `fusermount3 -u -z MOUNTPOINT`).
//   --mode drop    every unsynced write and every unsynced directory change is lost;
//   --mode subset  per file, a random subset of its unsynced writes survives (applied in the
//                  order they were made, over the synced content); per directory, either its
//                  synced names or its current names survive (a coin per directory).
// Hard links and device files are refused (EPERM); the store makes none.
// Not thread-compatible with anything but itself: one process per LIVE directory.

#define FUSE_USE_VERSION 34
#include <fuse.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct LogEntry {
  enum Kind { kWrite, kTruncate, kPunch } kind;
  uint64_t offset;  // kTruncate: the new size
  uint64_t length;
  uint64_t log_offset;  // kWrite: where the data sits in the node's log file
};

struct Node {
  bool is_dir = false;
  bool is_symlink = false;
  std::string symlink_target;
  mode_t special = 0;  // a socket or FIFO: its mode (no content)
  // Regular files: journal/base-ID holds the synced content. `base_shared` while it is a hard
  // link to the live file (startup state, not yet modified); `has_base` false: empty.
  bool has_base = false;
  bool base_shared = false;
  int log_fd = -1;
  uint64_t log_size = 0;
  std::vector<LogEntry> log;
  // Directories: synced names -> node id.
  std::map<std::string, uint64_t> entries;
};

struct Options {
  std::string live, journal, out, mode = "drop";
  uint64_t seed = 1;
};

Options g_opt;
// Operations hold the cut lock shared; the cut takes it exclusively and never lets go.
pthread_rwlock_t g_cut_lock;
// Guards g_nodes, g_by_ino and every Node. Taken inside the cut lock.
std::mutex g_mu;
std::unordered_map<uint64_t, std::unique_ptr<Node>> g_nodes;
std::unordered_map<uint64_t, uint64_t> g_by_ino;  // live st_ino -> node id
uint64_t g_next_id = 1;
uint64_t g_root = 0;
uint64_t g_writes_logged = 0, g_syncs = 0, g_dir_syncs = 0;

class OpGuard {
 public:
  OpGuard() { pthread_rwlock_rdlock(&g_cut_lock); }
  ~OpGuard() { pthread_rwlock_unlock(&g_cut_lock); }
  OpGuard(const OpGuard&) = delete;
  OpGuard& operator=(const OpGuard&) = delete;
};

std::string Live(const char* path) { return g_opt.live + path; }
std::string BasePath(uint64_t id) { return g_opt.journal + "/base-" + std::to_string(id); }
std::string LogPath(uint64_t id) { return g_opt.journal + "/log-" + std::to_string(id); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "powercut_fs: %s: %s\n", what.c_str(), std::strerror(errno));
  std::fflush(stderr);
  _exit(2);
}

// REQUIRES: g_mu held. A fresh node for a live inode (replacing a reused st_ino's mapping).
uint64_t NewNode(ino_t ino, mode_t mode) {
  uint64_t id = g_next_id++;
  auto node = std::make_unique<Node>();
  node->is_dir = S_ISDIR(mode);
  node->is_symlink = S_ISLNK(mode);
  if (S_ISSOCK(mode) || S_ISFIFO(mode)) node->special = mode;
  g_nodes[id] = std::move(node);
  g_by_ino[ino] = id;
  return id;
}

// REQUIRES: g_mu held. The node of a live inode (one made at startup, or by create/mkdir).
uint64_t NodeOf(ino_t ino, mode_t mode) {
  auto it = g_by_ino.find(ino);
  return it != g_by_ino.end() ? it->second : NewNode(ino, mode);
}

int NodeOfPath(const std::string& live, uint64_t* id) {
  struct stat st;
  if (::lstat(live.c_str(), &st) != 0) return -errno;
  *id = NodeOf(st.st_ino, st.st_mode);
  return 0;
}

void CopyFile(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY);
  if (in < 0) Die("open " + from);
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out < 0) Die("create " + to);
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0) Die("read " + from);
    if (n == 0) break;
    if (::write(out, buf.data(), static_cast<size_t>(n)) != n) Die("write " + to);
  }
  ::close(in);
  ::close(out);
}

// REQUIRES: g_mu held. Before the live file changes: a startup file's base stops being a
// hard link to it (a private copy of the content the disk holds).
void PrivatizeBase(uint64_t id) {
  Node& n = *g_nodes[id];
  if (!n.base_shared) return;
  std::string tmp = BasePath(id) + ".tmp";
  CopyFile(BasePath(id), tmp);
  if (::rename(tmp.c_str(), BasePath(id).c_str()) != 0) Die("rename " + tmp);
  n.base_shared = false;
}

// REQUIRES: g_mu held.
// REQUIRES: PrivatizeBase(id) before the live file changed.
void AppendLog(uint64_t id, LogEntry entry, const char* data) {
  Node& n = *g_nodes[id];
  if (entry.kind == LogEntry::kWrite) {
    if (n.log_fd < 0) {
      n.log_fd = ::open(LogPath(id).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
      if (n.log_fd < 0) Die("create " + LogPath(id));
    }
    entry.log_offset = n.log_size;
    if (::pwrite(n.log_fd, data, entry.length, static_cast<off_t>(n.log_size)) !=
        static_cast<ssize_t>(entry.length)) {
      Die("write " + LogPath(id));
    }
    n.log_size += entry.length;
    ++g_writes_logged;
  }
  n.log.push_back(entry);
}

// Before the live file of node `id` changes.
void BeforeChange(uint64_t id) {
  std::lock_guard lock(g_mu);
  PrivatizeBase(id);
}

// Applies one log entry of node `n` to the open file `fd`.
void Apply(const Node& n, const LogEntry& e, int fd) {
  switch (e.kind) {
    case LogEntry::kWrite: {
      std::vector<char> buf(e.length);
      if (::pread(n.log_fd, buf.data(), e.length, static_cast<off_t>(e.log_offset)) !=
          static_cast<ssize_t>(e.length)) {
        Die("read log");
      }
      if (::pwrite(fd, buf.data(), e.length, static_cast<off_t>(e.offset)) !=
          static_cast<ssize_t>(e.length)) {
        Die("apply write");
      }
      break;
    }
    case LogEntry::kTruncate:
      if (::ftruncate(fd, static_cast<off_t>(e.offset)) != 0) Die("apply truncate");
      break;
    case LogEntry::kPunch: {
      struct stat st;
      if (::fstat(fd, &st) != 0) Die("fstat");
      uint64_t end = std::min<uint64_t>(e.offset + e.length, static_cast<uint64_t>(st.st_size));
      if (e.offset < end) {
        std::vector<char> zeros(end - e.offset, 0);
        if (::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(e.offset)) !=
            static_cast<ssize_t>(zeros.size())) {
          Die("apply punch");
        }
      }
      break;
    }
  }
}

// REQUIRES: g_mu held. fsync: the log becomes the base.
void SyncNode(uint64_t id) {
  Node& n = *g_nodes[id];
  ++g_syncs;
  if (n.log.empty()) return;
  int fd = ::open(BasePath(id).c_str(), O_WRONLY | O_CREAT, 0600);
  if (fd < 0) Die("open " + BasePath(id));
  for (const LogEntry& e : n.log) Apply(n, e, fd);
  ::close(fd);
  n.has_base = true;
  n.log.clear();
  n.log_size = 0;
  if (n.log_fd >= 0 && ::ftruncate(n.log_fd, 0) != 0) Die("truncate log");
}

// REQUIRES: g_mu held. The live names of the directory open as `dir_fd`, as node ids.
int LiveEntriesAt(int dir_fd, std::map<std::string, uint64_t>* entries) {
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    (*entries)[name] = NodeOf(st.st_ino, st.st_mode);
  }
  ::closedir(d);
  return 0;
}

int LiveEntries(const std::string& dir, std::map<std::string, uint64_t>* entries) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  int r = LiveEntriesAt(fd, entries);
  ::close(fd);
  return r;
}

// Startup: everything in LIVE is durable. Files get a base that is a hard link to them.
void Adopt(const std::string& dir, uint64_t id) {
  std::map<std::string, uint64_t> entries;
  if (LiveEntries(dir, &entries) != 0) Die("read " + dir);
  g_nodes[id]->entries = entries;
  for (const auto& [name, child] : entries) {
    Node& c = *g_nodes[child];
    std::string path = dir + "/" + name;
    if (c.is_dir) {
      Adopt(path, child);
    } else if (c.special) {
      continue;
    } else if (c.is_symlink) {
      char target[4096];
      ssize_t len = ::readlink(path.c_str(), target, sizeof target);
      if (len < 0) Die("readlink " + path);
      c.symlink_target.assign(target, static_cast<size_t>(len));
    } else {
      if (::link(path.c_str(), BasePath(child).c_str()) != 0) Die("link " + path);
      c.has_base = c.base_shared = true;
    }
  }
}

// ---- The power cut ----------------------------------------------------------------------

struct CutStats {
  uint64_t files = 0, dirs = 0, writes_kept = 0, writes_lost = 0, dirs_live = 0;
};

void Materialize(uint64_t id, const std::string& out, std::mt19937_64& rng, CutStats& stats,
                 const std::map<uint64_t, std::string>& live_dirs) {
  const Node& n = *g_nodes.at(id);
  bool subset = g_opt.mode == "subset";
  if (n.is_dir) {
    ++stats.dirs;
    if (::mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) Die("mkdir " + out);
    std::map<std::string, uint64_t> entries = n.entries;
    auto live = live_dirs.find(id);
    if (subset && live != live_dirs.end() && (rng() & 1)) {
      entries.clear();
      if (LiveEntries(live->second, &entries) != 0) Die("read " + live->second);
      ++stats.dirs_live;
    }
    for (const auto& [name, child] : entries) {
      Materialize(child, out + "/" + name, rng, stats, live_dirs);
    }
    return;
  }
  if (n.is_symlink) {
    if (::symlink(n.symlink_target.c_str(), out.c_str()) != 0) Die("symlink " + out);
    return;
  }
  if (n.special) {
    if (::mknod(out.c_str(), n.special, 0) != 0) Die("mknod " + out);
    return;
  }
  ++stats.files;
  if (n.has_base) {
    CopyFile(BasePath(id), out);
  } else {
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) Die("create " + out);
    ::close(fd);
  }
  if (n.log.empty()) return;
  int fd = ::open(out.c_str(), O_WRONLY);
  if (fd < 0) Die("open " + out);
  for (const LogEntry& e : n.log) {
    if (subset && (rng() & 1)) {
      Apply(n, e, fd);
      ++stats.writes_kept;
    } else {
      ++stats.writes_lost;
    }
  }
  ::close(fd);
}

// The live directories reachable from LIVE, by node id (the "current names" of subset mode).
void LiveDirs(const std::string& dir, uint64_t id, std::map<uint64_t, std::string>* dirs) {
  (*dirs)[id] = dir;
  std::map<std::string, uint64_t> entries;
  if (LiveEntries(dir, &entries) != 0) return;
  for (const auto& [name, child] : entries) {
    if (g_nodes[child]->is_dir) LiveDirs(dir + "/" + name, child, dirs);
  }
}

void* CutThread(void*) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  int sig = 0;
  sigwait(&set, &sig);
  pthread_rwlock_wrlock(&g_cut_lock);  // never released: nothing completes after the cut
  std::lock_guard lock(g_mu);
  std::mt19937_64 rng(g_opt.seed);
  std::map<uint64_t, std::string> live_dirs;
  LiveDirs(g_opt.live, g_root, &live_dirs);
  CutStats stats;
  Materialize(g_root, g_opt.out, rng, stats, live_dirs);
  std::printf("{\"mode\": \"%s\", \"files\": %llu, \"dirs\": %llu, \"writes_logged\": %llu, "
              "\"unsynced_writes_kept\": %llu, \"unsynced_writes_lost\": %llu, "
              "\"dirs_with_unsynced_names_kept\": %llu, \"fsyncs\": %llu, \"dir_fsyncs\": %llu}\n",
              g_opt.mode.c_str(), (unsigned long long)stats.files,
              (unsigned long long)stats.dirs, (unsigned long long)g_writes_logged,
              (unsigned long long)stats.writes_kept, (unsigned long long)stats.writes_lost,
              (unsigned long long)stats.dirs_live, (unsigned long long)g_syncs,
              (unsigned long long)g_dir_syncs);
  std::fflush(stdout);
  _exit(0);
}

// ---- FUSE operations (each: pass through to LIVE, then record) --------------------------

struct Handle {
  int fd;
  uint64_t node;
};

Handle* H(fuse_file_info* fi) { return reinterpret_cast<Handle*>(fi->fh); }

int OpGetattr(const char* path, struct stat* st, fuse_file_info* fi) {
  OpGuard g;
  int r = fi ? ::fstat(H(fi)->fd, st) : ::lstat(Live(path).c_str(), st);
  return r == 0 ? 0 : -errno;
}

int OpReadlink(const char* path, char* buf, size_t size) {
  OpGuard g;
  ssize_t n = ::readlink(Live(path).c_str(), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

// Directories are opened for real: readdir and fsyncdir work on the handle (libfuse gives
// no path to fsyncdir with nullpath_ok).
int OpOpendir(const char* path, fuse_file_info* fi) {
  OpGuard g;
  int fd = ::open(Live(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  std::lock_guard lock(g_mu);
  fi->fh = reinterpret_cast<uint64_t>(new Handle{fd, NodeOf(st.st_ino, st.st_mode)});
  return 0;
}

int OpReleasedir(const char*, fuse_file_info* fi) {
  ::close(H(fi)->fd);
  delete H(fi);
  return 0;
}

int OpReaddir(const char*, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info* fi,
              fuse_readdir_flags) {
  OpGuard g;
  int fd = ::openat(H(fi)->fd, ".", O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  while (struct dirent* e = ::readdir(d)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(e->d_type) << 12;
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0))) break;
  }
  ::closedir(d);
  return 0;
}

int OpMkdir(const char* path, mode_t mode) {
  OpGuard g;
  if (::mkdir(Live(path).c_str(), mode) != 0) return -errno;
  struct stat st;
  if (::lstat(Live(path).c_str(), &st) != 0) return -errno;
  std::lock_guard lock(g_mu);
  NewNode(st.st_ino, st.st_mode);
  return 0;
}

int OpSymlink(const char* target, const char* path) {
  OpGuard g;
  if (::symlink(target, Live(path).c_str()) != 0) return -errno;
  struct stat st;
  if (::lstat(Live(path).c_str(), &st) != 0) return -errno;
  std::lock_guard lock(g_mu);
  g_nodes[NewNode(st.st_ino, st.st_mode)]->symlink_target = target;
  return 0;
}

int OpUnlink(const char* path) {
  OpGuard g;
  return ::unlink(Live(path).c_str()) == 0 ? 0 : -errno;
}

int OpRmdir(const char* path) {
  OpGuard g;
  return ::rmdir(Live(path).c_str()) == 0 ? 0 : -errno;
}

int OpRename(const char* from, const char* to, unsigned int flags) {
  OpGuard g;
  return ::renameat2(AT_FDCWD, Live(from).c_str(), AT_FDCWD, Live(to).c_str(), flags) == 0
             ? 0
             : -errno;
}

int OpLink(const char*, const char*) { return -EPERM; }
// Sockets (the store's control socket is bound there) and FIFOs; no device files.
int OpMknod(const char* path, mode_t mode, dev_t) {
  OpGuard g;
  if (!S_ISSOCK(mode) && !S_ISFIFO(mode)) return -EPERM;
  if (::mknod(Live(path).c_str(), mode, 0) != 0) return -errno;
  struct stat st;
  if (::lstat(Live(path).c_str(), &st) != 0) return -errno;
  std::lock_guard lock(g_mu);
  NewNode(st.st_ino, st.st_mode);
  return 0;
}

int OpChmod(const char* path, mode_t mode, fuse_file_info* fi) {
  OpGuard g;
  int r = fi ? ::fchmod(H(fi)->fd, mode) : ::chmod(Live(path).c_str(), mode);
  return r == 0 ? 0 : -errno;
}

int OpChown(const char* path, uid_t uid, gid_t gid, fuse_file_info* fi) {
  OpGuard g;
  int r = fi ? ::fchown(H(fi)->fd, uid, gid) : ::lchown(Live(path).c_str(), uid, gid);
  return r == 0 ? 0 : -errno;
}

int OpTruncate(const char* path, off_t size, fuse_file_info* fi) {
  OpGuard g;
  uint64_t id = 0;
  if (fi) {
    id = H(fi)->node;
  } else {
    std::lock_guard lock(g_mu);
    if (int r = NodeOfPath(Live(path), &id); r != 0) return r;
  }
  BeforeChange(id);
  int r = fi ? ::ftruncate(H(fi)->fd, size) : ::truncate(Live(path).c_str(), size);
  if (r != 0) return -errno;
  std::lock_guard lock(g_mu);
  AppendLog(id, {LogEntry::kTruncate, static_cast<uint64_t>(size), 0, 0}, nullptr);
  return 0;
}

int OpUtimens(const char* path, const struct timespec tv[2], fuse_file_info* fi) {
  OpGuard g;
  int r = fi ? ::futimens(H(fi)->fd, tv)
             : ::utimensat(AT_FDCWD, Live(path).c_str(), tv, AT_SYMLINK_NOFOLLOW);
  return r == 0 ? 0 : -errno;
}

// `created`: the live file was made by this open (O_EXCL succeeded): a new node, even where
// the inode number is reused (the old node stays with the synced names that still point at it).
int OpenCommon(int fd, fuse_file_info* fi, bool created) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  std::lock_guard lock(g_mu);
  uint64_t id = created ? NewNode(st.st_ino, st.st_mode) : NodeOf(st.st_ino, st.st_mode);
  if (fi->flags & O_TRUNC) {  // opened without it: the base is copied first
    PrivatizeBase(id);
    if (::ftruncate(fd, 0) != 0) {
      int err = errno;
      ::close(fd);
      return -err;
    }
    AppendLog(id, {LogEntry::kTruncate, 0, 0, 0}, nullptr);
  }
  fi->fh = reinterpret_cast<uint64_t>(new Handle{fd, id});
  return 0;
}

int OpCreate(const char* path, mode_t mode, fuse_file_info* fi) {
  OpGuard g;
  int flags = fi->flags & ~(O_DIRECT | O_TRUNC);
  int fd = ::open(Live(path).c_str(), flags | O_CREAT | O_EXCL, mode);
  if (fd >= 0) return OpenCommon(fd, fi, true);
  if (errno != EEXIST || (flags & O_EXCL)) return -errno;
  fd = ::open(Live(path).c_str(), flags & ~O_CREAT);
  if (fd < 0) return -errno;
  return OpenCommon(fd, fi, false);
}

int OpOpen(const char* path, fuse_file_info* fi) {
  OpGuard g;
  int fd = ::open(Live(path).c_str(), fi->flags & ~(O_DIRECT | O_TRUNC));
  if (fd < 0) return -errno;
  return OpenCommon(fd, fi, false);
}

int OpRead(const char*, char* buf, size_t size, off_t off, fuse_file_info* fi) {
  OpGuard g;
  ssize_t n = ::pread(H(fi)->fd, buf, size, off);
  return n < 0 ? -errno : static_cast<int>(n);
}

int OpWrite(const char*, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  OpGuard g;
  BeforeChange(H(fi)->node);
  ssize_t n = ::pwrite(H(fi)->fd, buf, size, off);
  if (n < 0) return -errno;
  std::lock_guard lock(g_mu);
  AppendLog(H(fi)->node, {LogEntry::kWrite, static_cast<uint64_t>(off),
                          static_cast<uint64_t>(n), 0}, buf);
  return static_cast<int>(n);
}

int OpStatfs(const char*, struct statvfs* st) {
  OpGuard g;
  return ::statvfs(g_opt.live.c_str(), st) == 0 ? 0 : -errno;
}

int OpRelease(const char*, fuse_file_info* fi) {
  ::close(H(fi)->fd);
  delete H(fi);
  return 0;
}

int OpFsync(const char*, int, fuse_file_info* fi) {
  OpGuard g;
  std::lock_guard lock(g_mu);
  SyncNode(H(fi)->node);
  return 0;
}

int OpFsyncdir(const char*, int, fuse_file_info* fi) {
  OpGuard g;
  std::lock_guard lock(g_mu);
  std::map<std::string, uint64_t> entries;
  if (int r = LiveEntriesAt(H(fi)->fd, &entries); r != 0) return r;
  g_nodes[H(fi)->node]->entries = std::move(entries);
  ++g_dir_syncs;
  return 0;
}

int OpFallocate(const char*, int mode, off_t off, off_t len, fuse_file_info* fi) {
  OpGuard g;
  int fd = H(fi)->fd;
  struct stat st;
  if (::fstat(fd, &st) != 0) return -errno;
  if (mode != 0 && mode != FALLOC_FL_KEEP_SIZE &&
      mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)) {
    return -EOPNOTSUPP;
  }
  BeforeChange(H(fi)->node);
  if (::fallocate(fd, mode, off, len) != 0) return -errno;
  std::lock_guard lock(g_mu);
  uint64_t end = static_cast<uint64_t>(off) + static_cast<uint64_t>(len);
  if (mode == 0 && end > static_cast<uint64_t>(st.st_size)) {
    AppendLog(H(fi)->node, {LogEntry::kTruncate, end, 0, 0}, nullptr);
  } else if (mode & FALLOC_FL_PUNCH_HOLE) {
    AppendLog(H(fi)->node, {LogEntry::kPunch, static_cast<uint64_t>(off),
                            static_cast<uint64_t>(len), 0}, nullptr);
  }
  return 0;
}

void* OpInit(fuse_conn_info*, fuse_config* cfg) {
  cfg->hard_remove = 1;  // unlinked open files stay reachable through their handles
  cfg->nullpath_ok = 1;
  cfg->use_ino = 0;
  return nullptr;
}

int Usage() {
  std::fprintf(stderr,
               "usage: powercut_fs LIVE MOUNTPOINT --journal DIR --out DIR "
               "[--mode drop|subset] [--seed N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  char live[PATH_MAX];
  if (!::realpath(argv[1], live)) Die(std::string("realpath ") + argv[1]);
  g_opt.live = live;
  std::string mountpoint = argv[2];
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--journal") g_opt.journal = value;
    else if (key == "--out") g_opt.out = value;
    else if (key == "--mode") g_opt.mode = value;
    else if (key == "--seed") g_opt.seed = std::strtoull(value.c_str(), nullptr, 10);
    else return Usage();
  }
  if (g_opt.journal.empty() || g_opt.out.empty() ||
      (g_opt.mode != "drop" && g_opt.mode != "subset")) {
    return Usage();
  }
  if (::mkdir(g_opt.journal.c_str(), 0700) != 0 && errno != EEXIST) Die("mkdir journal");
  // fuse_main changes to "/": every path kept is absolute.
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof cwd)) Die("getcwd");
  for (std::string* p : {&g_opt.journal, &g_opt.out}) {
    if ((*p)[0] != '/') *p = std::string(cwd) + "/" + *p;
  }

  {
    std::lock_guard lock(g_mu);
    struct stat st;
    if (::lstat(g_opt.live.c_str(), &st) != 0) Die("stat " + g_opt.live);
    g_root = NewNode(st.st_ino, st.st_mode);
    Adopt(g_opt.live, g_root);
  }

  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&g_cut_lock, &attr);

  // SIGUSR1 is blocked in every thread (libfuse's workers inherit this mask) and taken by
  // the cut thread alone.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  pthread_t cut;
  pthread_create(&cut, nullptr, CutThread, nullptr);

  fuse_operations ops{};
  ops.getattr = OpGetattr;
  ops.readlink = OpReadlink;
  ops.mknod = OpMknod;
  ops.mkdir = OpMkdir;
  ops.unlink = OpUnlink;
  ops.rmdir = OpRmdir;
  ops.symlink = OpSymlink;
  ops.rename = OpRename;
  ops.link = OpLink;
  ops.chmod = OpChmod;
  ops.chown = OpChown;
  ops.truncate = OpTruncate;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.write = OpWrite;
  ops.statfs = OpStatfs;
  ops.release = OpRelease;
  ops.fsync = OpFsync;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.releasedir = OpReleasedir;
  ops.fsyncdir = OpFsyncdir;
  ops.init = OpInit;
  ops.create = OpCreate;
  ops.utimens = OpUtimens;
  ops.fallocate = OpFallocate;

  std::vector<std::string> args = {"powercut_fs", mountpoint, "-f", "-o",
                                   "fsname=powercut,subtype=powercut,default_permissions"};
  std::vector<char*> fargv;
  for (auto& a : args) fargv.push_back(a.data());
  return fuse_main(static_cast<int>(fargv.size()), fargv.data(), &ops, nullptr);
}
