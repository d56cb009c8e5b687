// The `ckptfs` command. Each subcommand opens the store, does one thing, and reports what
// happened in words; exit status 0 on success, 1 on failure, 2 on a usage error.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "engine/store/content_writer.h"
#include "engine/store/store.h"
#include "fs/mount.h"
#include "fs/mount_options.h"

namespace ckptfs {
namespace {

constexpr size_t kIoBytes = 4 << 20;
constexpr const char* kCodecHelp =
    "how new records are compressed: auto, lz4, zstd, zstd:LEVEL, auto+zstd:LEVEL or none; "
    "default: what the store recorded when it was created (auto for a new store). For an "
    "existing store it applies while this process has it open and is not recorded";

int Fail(const Status& s) {
  std::fprintf(stderr, "ckptfs: %s\n", s.ToString().c_str());
  return 1;
}

Result<std::unique_ptr<Store>> OpenExisting(const std::string& dir, StoreOptions options = {}) {
  options.create_if_missing = false;
  return Store::Open(dir, options);
}

int Put(const std::string& dir, const std::string& name, const std::string& codec) {
  StoreOptions options;
  if (!codec.empty()) {
    auto spec = CodecSpec::Parse(codec);
    if (!spec.ok()) return Fail(spec.status());
    options.codec = *spec;
  }
  auto store = Store::Open(dir, options);
  if (!store.ok()) return Fail(store.status());
  auto writer = (*store)->NewWriter();
  Buffer buf(kIoBytes);
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(Status::FromErrno(errno, "read standard input"));
    if (n == 0) break;
    Status s = writer->Append(buf.bytes().first(static_cast<size_t>(n)));
    if (!s.ok()) return Fail(s);
  }
  Store* st = store->get();
  auto id = writer->Finish([&](Catalog::WriteTxn& txn, ContentId content) {
    return st->BindNameInTxn(txn, name, content);
  });
  if (!id.ok()) return Fail(id.status());
  return 0;
}

int Get(const std::string& dir, const std::string& name) {
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  auto id = (*store)->LookupName(name);
  if (!id.ok()) return Fail(id.status());
  Buffer buf(kIoBytes);
  for (uint64_t offset = 0;;) {
    auto n = (*store)->Read(*id, offset, buf.mutable_bytes());
    if (!n.ok()) return Fail(n.status());
    if (*n == 0) break;
    size_t done = 0;
    while (done < *n) {
      ssize_t w = ::write(STDOUT_FILENO, buf.data() + done, *n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Fail(Status::FromErrno(errno, "write standard output"));
      done += static_cast<size_t>(w);
    }
    offset += *n;
  }
  return 0;
}

int Remove(const std::string& dir, const std::string& name) {
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  Status s = (*store)->RemoveName(name);
  return s.ok() ? 0 : Fail(s);
}

int List(const std::string& dir) {
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  auto txn = (*store)->catalog().BeginRead();
  if (!txn.ok()) return Fail(txn.status());
  Status err;
  Status s = txn->ForEachName([&](std::string_view name, ContentId id) {
    auto row = txn->GetContent(id);
    uint64_t size = row.ok() && *row ? (*row)->size : 0;
    std::printf("%14llu  %.*s\n", static_cast<unsigned long long>(size),
                static_cast<int>(name.size()), name.data());
    return true;
  });
  return s.ok() ? 0 : Fail(s);
}

int Verify(const std::string& dir) {
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  auto report = (*store)->Verify();
  if (!report.ok()) return Fail(report.status());
  for (const auto& p : report->problems) std::printf("%s\n", p.c_str());
  std::printf("verify: %llu chunks, %llu contents checked: %s\n",
              static_cast<unsigned long long>(report->chunks_checked),
              static_cast<unsigned long long>(report->contents_checked),
              report->ok() ? "no problems"
                           : (std::to_string(report->problems.size()) + " problems").c_str());
  return report->ok() ? 0 : 1;
}

// True when `path` is inside a mounted ckptfs (the daemon answers its control attributes).
bool IsMounted(const std::string& path) {
  char buf[32];
  return ::getxattr(path.c_str(), "user.ckptfs.pid", buf, sizeof(buf)) > 0;
}

int Gc(const std::string& dir, double rewrite_below) {
  if (IsMounted(dir)) {  // a mounted store: the daemon runs gc
    if (::setxattr(dir.c_str(), "user.ckptfs.gc", "1", 1, 0) != 0) {
      return Fail(Status::FromErrno(errno, "gc through the mount " + dir));
    }
    std::printf("gc: done by the daemon serving %s\n", dir.c_str());
    return 0;
  }
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  GcOptions options;
  options.rewrite_below = rewrite_below;
  auto report = (*store)->Gc(options);
  if (!report.ok()) return Fail(report.status());
  for (const auto& s : report->skipped) std::printf("skipped %s\n", s.c_str());
  std::printf(
      "gc: dropped %llu chunks, stored %llu deltas whole, moved %llu records, deleted %llu "
      "packs, freed %llu bytes in place; pack bytes %llu -> %llu\n",
      static_cast<unsigned long long>(report->chunks_dropped),
      static_cast<unsigned long long>(report->deltas_rematerialized),
      static_cast<unsigned long long>(report->records_moved),
      static_cast<unsigned long long>(report->packs_deleted),
      static_cast<unsigned long long>(report->pack_bytes_punched),
      static_cast<unsigned long long>(report->pack_bytes_before),
      static_cast<unsigned long long>(report->pack_bytes_after));
  return 0;
}

int Stats(const std::string& dir) {
  if (IsMounted(dir)) {
    char buf[512];
    ssize_t n = ::getxattr(dir.c_str(), "user.ckptfs.stats", buf, sizeof(buf));
    if (n < 0) return Fail(Status::FromErrno(errno, "stats through the mount " + dir));
    std::fwrite(buf, 1, static_cast<size_t>(n), stdout);
    return 0;
  }
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  auto st = (*store)->Stats();
  if (!st.ok()) return Fail(st.status());
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf(
      "contents       %llu\nlogical bytes  %llu\nchunks         %llu\n"
      "chunk bytes    %llu\nrecord bytes   %llu\npack bytes     %llu\npacks          %llu\n",
      u(st->contents), u(st->logical_bytes), u(st->chunks), u(st->chunk_bytes), u(st->record_bytes),
      u(st->pack_bytes), u(st->packs));
  const auto& by = st->chunks_by_transform;
  std::printf(
      "plain chunks   %llu\nplanes chunks  %llu\ndelta chunks   %llu\nlongest chain  %llu\n",
      u(by[0]), u(by[1]), u(by[2] + by[3]), u(st->max_depth));
  if (st->logical_bytes > 0) {
    std::printf("stored/logical %.4f\n",
                static_cast<double>(st->pack_bytes) / static_cast<double>(st->logical_bytes));
  }
  return 0;
}

Status SetControl(const std::string& path, const char* name) {
  if (::setxattr(path.c_str(), name, "1", 1, 0) != 0) {
    return Status::FromErrno(
        errno, std::string(name + 11) + " " + path + " (is it inside a ckptfs mount?)");
  }
  return Status::OK();
}

int Sync(const std::string& mountpoint) {
  Status s = SetControl(mountpoint, "user.ckptfs.sync");
  return s.ok() ? 0 : Fail(s);
}

int Seal(const std::string& version) {
  Status s = SetControl(version, "user.ckptfs.seal");
  return s.ok() ? 0 : Fail(s);
}

// True while `pid` runs. A zombie has finished: the daemon is reparented to init, which may
// reap it late (or, in some containers, never).
bool Running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

// Makes everything durable, unmounts, and waits for the daemon to finish.
int Umount(const std::string& mountpoint) {
  char pid_buf[32] = {0};
  ssize_t n = ::getxattr(mountpoint.c_str(), "user.ckptfs.pid", pid_buf, sizeof(pid_buf) - 1);
  if (n <= 0) {
    return Fail(Status::FromErrno(errno, mountpoint + " is not a ckptfs mount"));
  }
  pid_t pid = static_cast<pid_t>(std::stol(std::string(pid_buf, static_cast<size_t>(n))));
  Status s = SetControl(mountpoint, "user.ckptfs.sync");
  if (!s.ok()) return Fail(s);
  pid_t child = ::fork();
  if (child == 0) {
    ::execlp("fusermount3", "fusermount3", "-u", mountpoint.c_str(), nullptr);
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Fail(Status::Busy("fusermount3 -u " + mountpoint + " failed (files still open?)"));
  }
  for (int i = 0; Running(pid); ++i) {
    if (i == 100) std::fprintf(stderr, "ckptfs: waiting for the daemon (pid %d) to finish\n", pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

}  // namespace
}  // namespace ckptfs

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("ckptfs");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);

  CLI::App app{"ckptfs: a deduplicating, compressing store for deep-learning checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ckptfs " CKPTFS_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "log what the store does");
  std::string store, name, codec;  // empty: the store's recorded codec
  double rewrite_below = 0.5;

  auto* put = app.add_subcommand("put", "store standard input as NAME (replacing it)");
  put->add_option("STORE", store, "store directory (created if missing)")->required();
  put->add_option("NAME", name, "name to store it under")->required();
  put->add_option("--codec", codec, ckptfs::kCodecHelp);
  auto* get = app.add_subcommand("get", "write the content named NAME to standard output");
  get->add_option("STORE", store)->required();
  get->add_option("NAME", name)->required();
  auto* rm = app.add_subcommand("rm", "forget NAME; its chunks go at the next gc");
  rm->add_option("STORE", store)->required();
  rm->add_option("NAME", name)->required();
  auto* ls = app.add_subcommand("ls", "list names and sizes");
  ls->add_option("STORE", store)->required();
  auto* verify =
      app.add_subcommand("verify", "check every record and reference; exit 1 on any problem");
  verify->add_option("STORE", store)->required();
  auto* gc =
      app.add_subcommand("gc", "free unreferenced chunks and compact packs (STORE or a mount)");
  gc->add_option("STORE", store)->required();
  gc->add_option("--rewrite-below", rewrite_below,
                 "rewrite packs whose live fraction is below this")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  auto* stats = app.add_subcommand("stats", "logical vs stored bytes (STORE or a mount)");
  stats->add_option("STORE", store)->required();

  ckptfs::MountArgs margs;
  std::string cache_size = "256M", inflight_size = "256M";
  double seal_after = 10;
  double snapshot_timeout = 1800;
  auto* mount = app.add_subcommand("mount", "mount STORE (created if missing) at MOUNTPOINT");
  mount->add_option("STORE", margs.store)->required();
  mount->add_option("MOUNTPOINT", margs.mountpoint)->required();
  mount->add_flag("-f,--foreground", margs.foreground, "stay in the foreground, log to stderr");
  mount->add_option("--cache-size", cache_size, "decoded-chunk cache, e.g. 128M")
      ->capture_default_str();
  mount
      ->add_option("--inflight", inflight_size, "bytes queued for compression before write() waits")
      ->capture_default_str();
  mount->add_option("--codec", codec, ckptfs::kCodecHelp);
  mount
      ->add_option("--delta-chain", margs.max_delta_chain,
                   "records a read may decode per chunk: a whole one and deltas on it; 1: "
                   "no deltas")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  mount
      ->add_option("--seal-after", seal_after,
                   "seal a version this many seconds after a newer one exists and its files "
                   "are closed; 0: only `ckptfs seal`")
      ->capture_default_str();
  mount
      ->add_option("--snapshot-timeout", snapshot_timeout,
                   "abandon a snapshot version whose ranks have not all committed this many "
                   "seconds after the first began")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::vector<std::string> mount_options;
  mount->add_option("-o", mount_options,
                    "comma-separated options, as in fstab: cache_size=, inflight=, codec=, "
                    "delta_chain=, seal_after=, snapshot_timeout= (as the flags above, and "
                    "applied after them), FUSE options (allow_other, ro, ...)");
  std::string mountpoint, version;
  auto* umount = app.add_subcommand("umount", "make everything durable, then unmount");
  umount->add_option("MOUNTPOINT", mountpoint)->required();
  auto* sync = app.add_subcommand("sync", "wait until everything written so far is durable");
  sync->add_option("MOUNTPOINT", mountpoint)->required();
  auto* seal = app.add_subcommand("seal", "seal a version: it becomes read-only");
  seal->add_option("MOUNTPOINT/VERSION", version)->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (verbose) spdlog::set_level(spdlog::level::info);

  using namespace ckptfs;
  if (*put) return Put(store, name, codec);
  if (*get) return Get(store, name);
  if (*rm) return Remove(store, name);
  if (*ls) return List(store);
  if (*verify) return Verify(store);
  if (*gc) return Gc(store, rewrite_below);
  if (*stats) return Stats(store);
  if (*mount) {
    auto cache = ParseSize(cache_size);
    auto inflight = ParseSize(inflight_size);
    auto spec = codec.empty() ? Result<CodecSpec>(CodecSpec{}) : CodecSpec::Parse(codec);
    for (const Status& st : {cache.status(), inflight.status(), spec.status()}) {
      if (!st.ok()) return Fail(st);
    }
    margs.cache_bytes = *cache;
    margs.inflight_bytes = *inflight;
    if (!codec.empty()) margs.codec = *spec;
    margs.seal_after = std::chrono::milliseconds(static_cast<int64_t>(seal_after * 1000));
    margs.snapshot_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(snapshot_timeout * 1000));
    for (const auto& list : mount_options) {
      if (Status st = ApplyMountOptions(list, &margs); !st.ok()) return Fail(st);
    }
    if (margs.foreground) spdlog::set_level(spdlog::level::info);
    return RunMount(margs);
  }
  if (*umount) return Umount(mountpoint);
  if (*sync) return Sync(mountpoint);
  if (*seal) return Seal(version);
  return 2;
}
