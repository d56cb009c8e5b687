#include "fs/mount.h"

#include <fcntl.h>
#include <grp.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stop_token>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/namespace/admin.h"
#include "engine/namespace/control_protocol.h"
#include "engine/namespace/control_server.h"
#include "engine/namespace/filesystem.h"
#include "engine/namespace/metrics_endpoint.h"
#include "engine/namespace/retention.h"
#include "engine/objstore/bucket_mirror.h"
#include "engine/objstore/remote_packs.h"
#include "engine/objstore/remote_versions.h"
#include "engine/objstore/s3_client.h"
#include "engine/store/store.h"
#include "engine/util/thread_role.h"
#include "fs/daemon_heap.h"
#include "fs/fuse_ops.h"
#include "fs/heap_trimmer.h"
#include "fs/passthrough.h"
#include "fs/sd_notify.h"

namespace ckptfs {
namespace {

constexpr int kReadaheadKb = 4096;
constexpr size_t kLogFileBytes = 16u << 20;
constexpr size_t kLogFiles = 3;

// The id of group `name` (-o control_group=NAME).
Result<uint32_t> GroupId(const std::string& name) {
  std::vector<char> buf(16384);
  group gr{};
  group* found = nullptr;
  int rc = ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found);
  if (rc != 0) return Status::FromErrno(rc, "look up group " + name);
  if (found == nullptr) {
    return Status::InvalidArgument("control_group=" + name +
                                   ": no such group (create it, or give an existing one)");
  }
  return static_cast<uint32_t>(gr.gr_gid);
}

// Reports the mount's outcome to the parent waiting in `ckptfs mount` (or to stderr).
class ReadyPipe {
 public:
  explicit ReadyPipe(int fd) : fd_(fd) {}
  void Report(const std::string& error) {
    if (fd_ < 0) {
      if (!error.empty()) std::fprintf(stderr, "ckptfs: %s\n", error.c_str());
      return;
    }
    std::string msg = error.empty() ? "ok" : error;
    (void)!::write(fd_, msg.data(), msg.size());
    ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// The kernel's readahead for a FUSE mount defaults to 128 KiB; sequential reads of multi-GB
// files arrive in larger requests with more (docs/fs.md). The mount's backing-device entry
// appears once the session serves requests, so this runs beside the loop.
void RaiseReadahead(const std::string& mountpoint) {
  std::thread([mountpoint] {
    struct stat st;
    if (::stat(mountpoint.c_str(), &st) != 0) return;
    std::string path = "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                       std::to_string(minor(st.st_dev)) + "/read_ahead_kb";
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      spdlog::info("cannot raise readahead ({}): {}", path, std::strerror(errno));
      return;
    }
    std::fprintf(f, "%d\n", kReadaheadKb);
    std::fclose(f);
    spdlog::info("readahead of {} set to {} KiB", mountpoint, kReadaheadKb);
  }).detach();
}

// An S3 store's client and location, with the cache restored from the bucket when it held no
// store (restored: the node's newest publication, which BucketMirror::Open takes).
struct OpenedS3 {
  std::unique_ptr<objstore::S3Client> client;
  objstore::S3Location location;
  std::optional<objstore::BucketMirror::Publication> restored;
};

// *node becomes the host name when empty.
Result<OpenedS3> OpenS3(const MountArgs& args, std::string* node) {
  CKPTFS_ASSIGN_OR_RETURN(objstore::S3Store s3,
                          objstore::OpenS3Store(args.s3_location, args.s3_endpoint));
  if (node->empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) return Status::FromErrno(errno, "gethostname");
    *node = host;
  }
  CKPTFS_ASSIGN_OR_RETURN(
      auto restored, objstore::BucketMirror::Restore(*s3.client, s3.location, *node, args.store));
  return OpenedS3{std::move(s3.client), std::move(s3.location), std::move(restored)};
}

int Serve(const MountArgs& args, ReadyPipe ready) {
  // What the daemon creates in the store (log, packs, catalog) is its user's alone
  // (docs/threat-model.md); the modes of files created through the mount come from the kernel.
  ::umask(077);
  // The stop signals must reach the main thread, which waits in fuse_session_loop_mt: libfuse's
  // handler only marks the session exited, so a signal taken by one of our threads (workers,
  // re-encoder, committer: they inherit this mask) would leave the loop waiting for a request
  // that never comes (a SIGTERM'd daemon hung in tests/packaging/test_deb.py under load).
  // libfuse's own worker threads block every signal. Unblocked again right before the loop.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // Before any thread exists: a thread that allocates before M_ARENA_MAX is 1 keeps an arena
  // of its own, outside the huge-page heap (fs/daemon_heap.h). The S3 client's, the bucket
  // fetchers' and the store's threads start below.
  ConfigureDaemonHeap();

  StoreOptions options;
  options.create_if_missing = args.create;
  options.codec = args.codec;
  options.cache_bytes = args.cache_bytes;
  options.inflight_bytes = args.inflight_bytes;
  options.max_delta_chain = args.max_delta_chain;
  options.reverse_deltas = args.reverse_deltas;
  options.compress_behind = args.compress_behind;
  // The reverse-delta crash test's switch (tests/fs/test_reencode_crash.py): a pause between
  // the re-encoder's synced records and its catalog transaction, for a kill to land in.
  if (const char* pause = std::getenv("CKPTFS_TEST_REENCODE_PAUSE_MS")) {
    const int ms = std::atoi(pause);
    options.before_reencode_commit = [ms] {
      spdlog::warn("CKPTFS_TEST_REENCODE_PAUSE_MS: re-encoded records synced, pausing {} ms", ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
  }
  // The daemon logs into the store (rotated: ckptfs.log, then ckptfs.1.log ... ckptfs.3.log,
  // 16 MiB each; docs/cli.md), from before the store opens where the store exists already, so
  // that what opening it recovered after a crash (a cut pack tail, resumed re-encoding) is in
  // the log too. A new store gets its log once Store::Open made the directory.
  auto start_log = [&]() -> bool {
    if (args.foreground || spdlog::get("ckptfs-daemon")) return true;
    try {
      auto log = spdlog::rotating_logger_mt("ckptfs-daemon", args.store + "/ckptfs.log",
                                            kLogFileBytes, kLogFiles);
      log->flush_on(spdlog::level::info);
      spdlog::set_default_logger(log);
      spdlog::set_level(spdlog::level::info);
      return true;
    } catch (const spdlog::spdlog_ex& e) {
      ready.Report(std::string("cannot open the log in the store: ") + e.what());
      return false;
    }
  };
  // An S3 store: this node's cache is filled from the bucket first if it holds no store.
  std::unique_ptr<objstore::S3Client> s3;
  std::optional<objstore::S3Location> s3_location;
  std::shared_ptr<objstore::RemotePacks> remote_packs;  // records read from the bucket
  std::optional<objstore::BucketMirror::Publication> restored;
  std::string node = args.node;
  if (!args.s3_location.empty()) {
    auto opened = OpenS3(args, &node);
    if (!opened.ok()) {
      ready.Report(opened.status().ToString());
      return 1;
    }
    s3 = std::move(opened->client);
    s3_location = std::move(opened->location);
    restored = std::move(opened->restored);
    // Packs restored on demand are read from the bucket as their records are needed.
    auto remote = objstore::RemotePacks::Open(s3.get(), *s3_location, args.store);
    if (!remote.ok()) {
      ready.Report(remote.status().ToString());
      return 1;
    }
    remote_packs = *remote;
    options.remote_records = std::move(*remote);
    // A sync uploads what it made durable: raw pieces compressed later would be uploaded
    // twice, raw first. In a bucket, bytes cost more than the save's encoding time.
    options.compress_behind = false;
  }
  std::error_code exists_ec;
  if (std::filesystem::exists(args.store + "/ckptfs.json", exists_ec) && !start_log()) return 1;
  auto store = Store::Open(args.store, options);
  if (!store.ok()) {
    ready.Report(store.status().ToString());
    return 1;
  }
  // Declared before the filesystem, so that the filesystem's last Sync can still publish.
  std::unique_ptr<objstore::BucketMirror> mirror;
  if (s3) {
    auto opened = objstore::BucketMirror::Open(s3.get(), *s3_location, node, store->get(),
                                               remote_packs.get(), std::move(restored));
    if (!opened.ok()) {
      ready.Report("cannot read this node's manifests in " + args.s3_location + ": " +
                   opened.status().ToString());
      return 1;
    }
    mirror = std::move(*opened);
  }
  const std::string codec = (*store)->options().codec->ToString();  // given, else recorded
  if (!start_log()) return 1;
  // One descriptor per pack file read: allow as many as the system lets us.
  rlimit files;
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &files);
  }
  FileSystemOptions fs_options;
  fs_options.seal_after = args.seal_after;
  // The write spool cost more than it saved in a quiet fs.sh --spool-compare (1.3x the
  // daemon CPU, its pages written back to disk, RSS over budget; durable save 4.51 s vs
  // 4.32 s, no-fsync save 4.92 s vs 5.57 s; docs/fs.md, "Tuning choices"), so the daemon runs
  // without it unless CKPTFS_SPOOL=1 (the benchmark's and the crash test's switch).
  if (const char* spool = std::getenv("CKPTFS_SPOOL"); spool && std::string(spool) == "1") {
    spdlog::warn("CKPTFS_SPOOL=1: writes land in a spool and are ingested behind the writer");
  } else {
    fs_options.spool_backlog_bytes = 0;
  }
  if (mirror) fs_options.after_durable = [m = mirror.get()] { return m->Publish(); };
  // The fsync journal of passthrough files (docs/fs.md, "Fsync journal"); CKPTFS_FSYNC_JOURNAL=0
  // makes their fsync commit as every other file's does (the benchmark's and the tests' switch).
  if (const char* j = std::getenv("CKPTFS_FSYNC_JOURNAL"); j && std::string(j) == "0") {
    spdlog::warn("CKPTFS_FSYNC_JOURNAL=0: fsync commits passthrough files");
    fs_options.fsync_journal = false;
  }
  auto fs = FileSystem::Open(store->get(), fs_options);
  if (!fs.ok()) {
    ready.Report(fs.status().ToString());
    return 1;
  }
  // Versions of other nodes, and this node's parts of its own (remote_versions.h); stopped
  // before the filesystem.
  std::unique_ptr<objstore::RemoteVersions> versions;
  if (mirror) {
    versions = objstore::RemoteVersions::Start(s3.get(), mirror.get(), store->get(), fs->get(),
                                               remote_packs.get(),
                                               {args.rank, args.world_size, args.remote_poll});
  }
  // MNT/.ckptfs/stats: what `ckptfs stats --json` says of a mounted store (admin.h).
  (*fs)->SetLiveStats([served = fs->get(), st = store->get(),
                       mnt = std::filesystem::weakly_canonical(args.mountpoint).string()] {
    auto r = RunAdmin(st, served, {{"cmd", "stats"}});
    nlohmann::json doc = r.ok() ? *r : nlohmann::json{{"error", r.status().ToString()}};
    doc["store"] = std::filesystem::weakly_canonical(st->dir()).string();
    doc["mount"] = mnt;
    if (FusePassthrough* pt = FusePassthrough::Get()) {
      doc["passthrough"] = {{"enabled", pt->enabled()}, {"opens", pt->opened()}};
    }
    return doc.dump(2) + "\n";
  });

  // The Prometheus endpoint, when asked for; stopped before the filesystem.
  std::unique_ptr<MetricsEndpoint> metrics;
  if (args.prometheus_port != 0) {
    auto started =
        MetricsEndpoint::Start(args.prometheus_port, [served = fs->get(), st = store->get()] {
          return RunAdmin(st, served, {{"cmd", "stats"}});
        });
    if (!started.ok()) {
      ready.Report(started.status().ToString());
      return 1;
    }
    metrics = std::move(*started);
  }

  // The snapshot engine's control socket (docs/snapshot.md); stopped before the filesystem.
  std::optional<uint32_t> control_gid;
  if (!args.control_group.empty()) {
    auto gid = GroupId(args.control_group);
    if (!gid.ok()) {
      ready.Report(gid.status().ToString());
      return 1;
    }
    control_gid = *gid;
  }
  auto control = ControlServer::Start(fs->get(), store->get(),
                                      std::filesystem::path(args.store) / kControlSocketName,
                                      args.snapshot_timeout, control_gid);
  if (!control.ok()) {
    ready.Report("cannot start the control socket: " + control.status().ToString());
    return 1;
  }
  SetControlSocketPath((*control)->path().string());

  std::vector<std::string> argv_s = {"ckptfs", "-o",
                                     "fsname=ckptfs:" + args.store +
                                         ",subtype=ckptfs,"
                                         "default_permissions"};
  for (const auto& o : args.fuse_options) {
    argv_s.push_back("-o");
    argv_s.push_back(o);
  }
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&fargs, &FuseOps(), sizeof(fuse_lowlevel_ops), fs->get());
  if (se == nullptr) {
    ready.Report("could not start a FUSE session (bad -o option?)");
    return 1;
  }
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, args.mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    ready.Report("could not mount at " + args.mountpoint +
                 ": is it an existing empty directory, is /dev/fuse there, are you root?");
    return 1;
  }
  // FUSE passthrough for files written from empty (fs/passthrough.h); CKPTFS_PASSTHROUGH=0
  // turns it off (the tests run both ways). The kernel's writeback cache excludes it.
  {
    const char* pt = std::getenv("CKPTFS_PASSTHROUGH");
    const char* wb = std::getenv("CKPTFS_WRITEBACK_CACHE");
    const bool allowed = !(pt != nullptr && std::string(pt) == "0") &&
                         !(wb != nullptr && std::string(wb) == "1") &&
                         (*fs)->passthrough_possible();
    if (Status s = FusePassthrough::Install(se, allowed); !s.ok()) {
      spdlog::warn("FUSE passthrough unavailable: {}", s.ToString());
    }
  }
  // A rewrite of a file changes its views: the kernel drops what it caches of them at once.
  (*fs)->SetOnViewChanged([se](Ino ino) { (void)fuse_lowlevel_notify_inval_inode(se, ino, 0, 0); });
  // Rotation as versions seal; the kernel forgets each removed name at once.
  std::unique_ptr<Retention> retention;
  if (args.keep_last > 0) {
    retention = Retention::Start(store->get(), fs->get(), {args.keep_last, args.keep_every},
                                 [se](Ino parent, const std::string& name) {
                                   (void)fuse_lowlevel_notify_inval_entry(se, parent, name.data(),
                                                                          name.size());
                                 });
    (*fs)->SetOnSealed([r = retention.get()] { r->Notify(); });
    retention->Notify();  // versions sealed before this mount may be due already
  }
  spdlog::info("mounted {} at {} (cache {} MiB, inflight {} MiB, codec {}, delta chain {})",
               args.store, args.mountpoint, args.cache_bytes >> 20, args.inflight_bytes >> 20,
               codec, args.max_delta_chain);
  ready.Report("");
  // Under systemd (Type=notify): units ordered after this one start once the mount serves.
  if (Status s = NotifyServiceManager("READY=1\nSTATUS=serving " + args.mountpoint); !s.ok()) {
    spdlog::error("cannot notify the service manager: {}", s.ToString());
  }
  if (!args.foreground) {
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::close(null);
    }
  }
  RaiseReadahead(args.mountpoint);
  // A cache just restored is synced behind the mount, which serves meanwhile (bucket_mirror.h).
  std::jthread settle;
  if (s3) {
    settle = std::jthread([dir = args.store] {
      SetThreadRole("settle");
      if (Status st = objstore::BucketMirror::SettleRestore(dir); !st.ok()) {
        spdlog::warn("cannot sync the restored cache {} ({}); the next mount restores it again",
                     dir, st.ToString());
      }
    });
  }
  // With one arena, freed buffers sit in holes of one heap that only malloc_trim returns;
  // fs/heap_trimmer.h trims once the daemon goes quiet, or when the holes would take it past
  // the budget (cache + in-flight + 32 MiB).
  std::jthread trimmer(
      [limit = args.cache_bytes + args.inflight_bytes + (32 << 20),
       huge_pages = HugePageHeapRequested(std::getenv("GLIBC_TUNABLES"))](std::stop_token stop) {
        SetThreadRole("trim");
        RunHeapTrimmer(stop, limit, huge_pages);
      });
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, 16);
  ::pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);  // every other thread exists by now
  int rc = fuse_session_loop_mt(se, cfg);
  // SIGTERM (systemd's stop), SIGINT and SIGHUP end the loop through libfuse's handlers, which
  // return the signal's number: a requested stop, as clean as an unmount.
  bool stopped_by_signal = rc == SIGTERM || rc == SIGINT || rc == SIGHUP;
  (void)NotifyServiceManager("STOPPING=1\nSTATUS=committing accepted files");
  trimmer.request_stop();
  (*fs)->SetOnSealed(nullptr);
  (*fs)->SetOnViewChanged(nullptr);  // commits go on after the session is gone
  retention.reset();  // finishes a pass in progress (it may notify the session: still there)
  fuse_loop_cfg_destroy(cfg);
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  // The mount is gone; committing what close() accepted remains. A stop signal now must not cut
  // it short: systemd sends SIGTERM to what is left of a .mount unit once umount(8) returned.
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, SIG_IGN);
  spdlog::info("unmounted {}; committing open files", args.mountpoint);
  versions.reset();
  metrics.reset();
  control->reset();  // abandons versions not yet complete
  fs->reset();       // commits everything close() accepted
  mirror.reset();    // its last publication was the filesystem's; it uploads ahead no more
  store->reset();
  if (remote_packs) {
    spdlog::info("read on demand from {}: {} ranged GETs, {} bytes", args.s3_location,
                 remote_packs->gets(), remote_packs->fetched_bytes());
  }
  spdlog::info("store {} closed", args.store);
  return rc == 0 || stopped_by_signal ? 0 : 1;
}

}  // namespace

int RunMount(const MountArgs& args) {
  if (args.foreground) return Serve(args, ReadyPipe(-1));
  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("ckptfs: pipe");
    return 1;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("ckptfs: fork");
    return 1;
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    ::_exit(Serve(args, ReadyPipe(fds[1])));
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (msg == "ok") return 0;
  std::fprintf(stderr, "ckptfs: mount failed: %s\n",
               msg.empty() ? "the daemon exited before mounting" : msg.c_str());
  return 1;
}

}  // namespace ckptfs
