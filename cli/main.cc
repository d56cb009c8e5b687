// The `ckptfs` command: arguments, help and dispatch. The commands live in the other units of
// cli/ (cli/cli.h lists them); each reports in words, or in JSON with --json, and returns the
// exit status: 0 success, 1 failure, 2 usage error (docs/cli.md).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>

#include "cli/admin_commands.h"
#include "cli/cli.h"
#include "cli/export_commands.h"
#include "cli/mount_commands.h"
#include "cli/store_commands.h"
#include "engine/objstore/s3_config.h"
#include "engine/store/store.h"
#include "fs/daemon_heap.h"
#include "fs/mount.h"
#include "fs/mount_options.h"

namespace ckptfs::cli {
namespace {

constexpr const char* kCodecHelp =
    "how new records are compressed: auto, lz4, zstd, zstd:LEVEL, auto+zstd:LEVEL or none; "
    "default: what the store recorded when it was created (auto for a new store). For an "
    "existing store it applies while this process has it open and is not recorded";

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The subcommand closest to `word` (by edit distance, or the one it is a prefix of), if any
// is close enough to be a likely typo.
std::optional<std::string> Closest(const std::string& word, const std::vector<std::string>& names) {
  std::optional<std::string> best;
  size_t best_d = 3;  // at most two edits
  for (const auto& n : names) {
    size_t d = n.rfind(word, 0) == 0 ? 1 : EditDistance(word, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return best;
}

constexpr const char* kTargetHelp = "a store directory, or a ckptfs mount (or a path inside one)";
constexpr const char* kJsonHelp = "print one JSON object (schema in docs/cli.md) instead of words";

// A command on a STORE|MNT target (its first argument) that can answer in JSON.
CLI::App* TargetCommand(CLI::App& app, const char* name, const char* what, std::string* target,
                        bool* json) {
  CLI::App* sub = app.add_subcommand(name, what);
  sub->add_option("STORE", *target, kTargetHelp)->required();
  sub->add_flag("--json", *json, kJsonHelp);
  return sub;
}

// `word` is not a command: says so, with the command probably meant; returns kExitUsage.
int UnknownCommand(const std::string& word, const std::vector<std::string>& names) {
  std::fprintf(stderr, "ckptfs: '%s' is not a ckptfs command.", word.c_str());
  if (auto close = Closest(word, names))
    std::fprintf(stderr, " Did you mean '%s'?", close->c_str());
  std::fprintf(stderr, "\nSee `ckptfs help` for the commands.\n");
  return kExitUsage;
}

// After a parse error: the first option of argv that neither `sub` nor
// `app` knows, and the option of `sub` it was probably meant to be. Words on stderr; false
// when no unknown option is found (the error is about something else).
bool ExplainUnknownOption(const CLI::App& app, const CLI::App& sub, int argc, char** argv) {
  std::vector<std::string> known;
  for (const CLI::Option* opt : sub.get_options()) {
    for (const auto& l : opt->get_lnames()) known.push_back("--" + l);
    for (const auto& s : opt->get_snames()) known.push_back("-" + s);
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || std::isdigit(static_cast<unsigned char>(arg[1]))) {
      continue;
    }
    arg = arg.substr(0, arg.find('='));
    if (sub.get_option_no_throw(arg) != nullptr || app.get_option_no_throw(arg) != nullptr) {
      continue;
    }
    std::fprintf(stderr, "ckptfs %s: no option '%s'.", sub.get_name().c_str(), arg.c_str());
    if (auto close = Closest(arg, known))
      std::fprintf(stderr, " Did you mean '%s'?", close->c_str());
    std::fprintf(stderr, "\nSee `ckptfs help %s` for its arguments.\n", sub.get_name().c_str());
    return true;
  }
  return false;
}

}  // namespace
}  // namespace ckptfs::cli

int main(int argc, char** argv) {
  using namespace ckptfs;
  using namespace ckptfs::cli;
  auto logger = spdlog::stderr_color_mt("ckptfs");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);
  // The daemon's heap in huge pages (fs/daemon_heap.h): `ckptfs mount` runs again with the
  // glibc tunable that asks for them, before it parses anything or forks the daemon.
  if (IsMountCommand(argc, argv)) ReexecWithHugePageHeap(argv);

  CLI::App app{
      "ckptfs: a deduplicating, compressing store for deep-learning checkpoints.\n"
      "`ckptfs help COMMAND` describes a command; docs/cli.md has the --json schemas.",
      "ckptfs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ckptfs " CKPTFS_VERSION " (store format " +
                                        std::to_string(kStoreFormatVersion) + ")");
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "log what the store does");
  std::string store, name, codec;  // codec empty: the store's recorded codec
  bool create = false, json = false;
  double rewrite_below = 0.5;
  const char* kStoreHelp = "the store directory";

  auto* init = app.add_subcommand("init", "create a store and record its settings (codec)");
  init->add_option("STORE", store,
                   "a new or empty directory for the store, or s3://BUCKET/PREFIX "
                   "(docs/scale-out.md)")
      ->required();
  std::string endpoint;
  init->add_option("--endpoint", endpoint,
                   "with s3://: the S3 endpoint URL (default: AWS_ENDPOINT_URL)");
  init->add_option("--codec", codec,
                   "how records are compressed (recorded; default auto): "
                   "auto, lz4, zstd, zstd:LEVEL, auto+zstd:LEVEL or none");
  init->add_flag("--json", json, kJsonHelp);
  auto* upgrade = app.add_subcommand(
      "upgrade", "upgrade an older store's format in place (older ckptfs cannot open it then)");
  upgrade->add_option("STORE", store, kStoreHelp)->required();
  upgrade->add_flag("--json", json, kJsonHelp);

  auto* put = app.add_subcommand("put", "store standard input as NAME (replacing it)");
  put->add_option("STORE", store, kStoreHelp)->required();
  put->add_option("NAME", name, "name to store it under")->required();
  put->add_option("--codec", codec, kCodecHelp);
  put->add_flag("--create", create, "create the store if STORE has none");
  auto* get = app.add_subcommand("get", "write the content named NAME to standard output");
  get->add_option("STORE", store, kStoreHelp)->required();
  get->add_option("NAME", name, "a name given to put")->required();
  auto* rm = app.add_subcommand("rm", "forget NAME; its chunks go at the next gc");
  rm->add_option("STORE", store, kStoreHelp)->required();
  rm->add_option("NAME", name, "a name given to put")->required();
  auto* ls = app.add_subcommand("ls", "list the names given to put, with their sizes");
  ls->add_option("STORE", store, kStoreHelp)->required();
  ls->add_flag("--json", json, kJsonHelp);
  auto* verify = TargetCommand(
      app, "verify", "check every record and reference; exit 1 on any problem", &store, &json);
  auto* gc = TargetCommand(
      app, "gc", "free unreferenced chunks and compact packs (STORE or a mount)", &store, &json);
  gc->add_option("--rewrite-below", rewrite_below,
                 "rewrite packs whose live fraction is below this")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  double grace = 3600;
  gc->add_option("--grace", grace,
                 "with s3://BUCKET/PREFIX: keep objects and uploads younger than this many "
                 "seconds (uploads in flight); docs/scale-out.md")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gc->add_option("--endpoint", endpoint, "with s3://: the S3 endpoint URL");
  auto* stats =
      TargetCommand(app, "stats", "logical vs stored bytes (STORE or a mount)", &store, &json);
  std::string version;
  auto* log = TargetCommand(
      app, "log", "the versions: when, sealed, files, bytes each added to the store, training step",
      &store, &json);
  log->add_option("VERSION", version, "one version, with its files");
  uint64_t keep_last = 0, keep_every = 0;
  bool dry_run = false;
  auto* forget = TargetCommand(
      app, "forget", "remove old sealed versions, keeping the last N (and every K-th), then gc",
      &store, &json);
  forget->add_option("--keep-last", keep_last, "keep the newest N versions")
      ->required()
      ->check(CLI::PositiveNumber);
  forget
      ->add_option("--keep-every", keep_every,
                   "also keep every K-th version counted from the oldest (1st, K+1-th, ...)")
      ->check(CLI::PositiveNumber);
  forget->add_flag("--dry-run", dry_run, "say what would be removed; change nothing");
  std::string v1, v2, dest, to, dtype;
  auto* diff = TargetCommand(
      app, "diff", "compare two versions per file and per tensor (changed elements, max |diff|)",
      &store, &json);
  diff->add_option("V1", v1, "the older version")->required();
  diff->add_option("V2", v2, "the newer version")->required();
  auto* export_ = app.add_subcommand(
      "export",
      "write a checkpoint's tensors as a torch file, safetensors or .npy files (no pickle code "
      "runs)");
  export_
      ->add_option("SOURCE", name, "MNT/VERSION/FILE, or STORE/VERSION/FILE of an unmounted store")
      ->required();
  export_->add_option("DEST", dest, "a new file (pt, safetensors) or directory (npy)")->required();
  export_
      ->add_option("--to", to,
                   "pt (torch.load reads it: a flat dict of tensors named as in the per-tensor "
                   "view), safetensors or npy")
      ->required()
      ->check(CLI::IsMember({"safetensors", "npy", "pt"}));
  export_->add_option("--dtype", dtype, "convert floating tensors: fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  export_->add_flag("--json", json, kJsonHelp);
  auto* restore = TargetCommand(
      app, "restore", "copy a version's files out of a store (mounted or not) into a new directory",
      &store, &json);
  restore->add_option("VERSION", version, "the version to restore")->required();
  restore->add_option("DIR", dest, "a new directory")->required();
  std::string mtbf;
  double save_seconds = 0;
  auto* advise = app.add_subcommand(
      "advise",
      "how often to checkpoint: Young's and Daly's interval from the mean time between failures "
      "and the save cost measured on the store's recent versions");
  advise->add_option("STORE", store,
                     "the store (or mount) whose versions measure the save cost; not needed "
                     "with --save-seconds");
  advise
      ->add_option("--mtbf", mtbf,
                   "mean time between failures of the job: 6h, 90m, 2d, 1h30m (s, m, h, d, w)")
      ->required();
  advise
      ->add_option("--save-seconds", save_seconds,
                   "the cost of one save in seconds, instead of what the store measured")
      ->check(CLI::PositiveNumber);
  advise->add_flag("--json", json, kJsonHelp);
  auto* status = app.add_subcommand(
      "status", "the ckptfs mounts of this machine: stores, daemons, settings, queues");
  status->add_flag("--json", json, kJsonHelp);

  MountArgs margs;
  std::string cache_size = "256M", inflight_size = "256M";
  double seal_after = 10;
  double snapshot_timeout = 1800;
  auto* mount = app.add_subcommand("mount", "mount STORE at MOUNTPOINT (a daemon serves it)");
  mount->add_option("STORE", margs.store, "the store directory (see `ckptfs init`)")->required();
  mount->add_option("MOUNTPOINT", margs.mountpoint, "an existing directory, not a mount point")
      ->required();
  mount->add_flag("--create", margs.create, "create the store if STORE has none");
  std::string cache_dir;
  mount->add_option("--cache-dir", cache_dir,
                    "with STORE s3://BUCKET/PREFIX: this node's local store and cache, filled "
                    "from the bucket when empty (docs/scale-out.md)");
  mount->add_option("--endpoint", margs.s3_endpoint,
                    "with s3://: the S3 endpoint URL (default: AWS_ENDPOINT_URL)");
  mount->add_option("--node", margs.node,
                    "with s3://: the name this node publishes under (default: the host name)");
  double remote_poll = 5;
  mount->add_option("--rank", margs.rank,
                    "with s3:// and --world-size: this node's rank; its sealed versions are "
                    "published as that rank's part (docs/scale-out.md)");
  mount->add_option("--world-size", margs.world_size,
                    "with s3://: the ranks of a version; a version shows on every mount once all "
                    "have published their part (0: this node reads versions, writes no parts)");
  mount
      ->add_option("--remote-poll", remote_poll,
                   "with s3://: seconds between looks at the bucket for versions of other nodes")
      ->capture_default_str();
  mount->add_flag("-f,--foreground", margs.foreground, "stay in the foreground, log to stderr");
  mount->add_option("--cache-size", cache_size, "decoded-chunk cache, e.g. 128M, 4G, 1T")
      ->capture_default_str();
  mount
      ->add_option("--inflight", inflight_size, "bytes queued for compression before write() waits")
      ->capture_default_str();
  mount->add_option("--codec", codec, kCodecHelp);
  mount
      ->add_option("--delta-chain", margs.max_delta_chain,
                   "records a read may decode per chunk: a whole one and deltas on it; 1: "
                   "no deltas")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  bool forward_deltas = false;
  mount->add_flag("--forward-deltas", forward_deltas,
                  "no background re-encoding into reverse deltas: the newest version then reads "
                  "through delta chains (for comparison; docs/engine.md)");
  bool compress_at_write = false;
  mount->add_flag("--compress-at-write", compress_at_write,
                  "compress new pieces as they are written, instead of writing them raw for the "
                  "background re-encoder to compress (the default: saves then pay no encoding; "
                  "docs/fs.md)");
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
  mount
      ->add_option("--keep-last", margs.keep_last,
                   "rotation: each time a version seals, forget the sealed versions but the "
                   "newest N (as `ckptfs forget --keep-last N`), then gc")
      ->check(CLI::PositiveNumber);
  mount->add_option("--keep-every", margs.keep_every,
                    "with --keep-last: keep every K-th version from the oldest too");
  mount
      ->add_option("--prometheus", margs.prometheus_port,
                   "serve the statistics of `ckptfs stats` in Prometheus' text format at "
                   "http://127.0.0.1:PORT/metrics (off unless given)")
      ->check(CLI::Range(1, 65535));
  mount->add_option("--control-group", margs.control_group,
                    "let the members of this group use the control socket too (snapshots and "
                    "ckptfs commands), e.g. a training job not run by the daemon's user");
  std::vector<std::string> mount_options;
  mount->add_option(
      "-o", mount_options,
      "comma-separated options, as in fstab: cache_size=, inflight=, codec=, "
      "delta_chain=, seal_after=, snapshot_timeout=, forward_deltas, compress_at_write, "
      "keep_last=, "
      "keep_every=, prometheus=, control_group=, create (as the flags above, "
      "and applied after them), FUSE options (allow_other, ro, ...)");
  std::string mountpoint;
  auto* umount = app.add_subcommand("umount", "make everything durable, then unmount");
  umount->add_option("MOUNTPOINT", mountpoint, "a ckptfs mount point")->required();
  auto* sync = app.add_subcommand("sync", "wait until everything written so far is durable");
  sync->add_option("MOUNTPOINT", mountpoint, "a ckptfs mount (or a path inside one)")->required();
  auto* seal = app.add_subcommand("seal", "seal a version: it becomes read-only");
  seal->add_option("MOUNTPOINT/VERSION", version, "a version: a directory at the top of a mount")
      ->required();

  std::string marked_dir;
  bool file_versions_off = false;
  auto* file_versions = app.add_subcommand(
      "file-versions",
      "make every checkpoint file (*.ckpt, *.pt, ...) in a directory a version of its own, for "
      "Lightning's and ckpt_{step}.pt loops' one-directory layouts (docs/fs.md)");
  file_versions
      ->add_option("DIR", marked_dir, "a directory in a ckptfs mount (the mount point too)")
      ->required();
  file_versions->add_flag(
      "--off", file_versions_off,
      "new checkpoint files there are ordinary again (sealed ones stay sealed)");

  std::string help_topic;
  auto* help = app.add_subcommand("help", "describe ckptfs, or one command");
  help->add_option("COMMAND", help_topic, "the command to describe");

  std::vector<std::string> names;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  if (argc == 1) {
    std::fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  // A mistyped command: say which one was probably meant.
  int command_at = 0;
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      return UnknownCommand(word, names);
    }
    command_at = i;
    break;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A mistyped option (which may also leave a required one missing): name the one meant.
    // argv[command_at] is a command (checked above).
    if (e.get_exit_code() != 0 && command_at > 0 &&
        ExplainUnknownOption(app, *app.get_subcommand(argv[command_at]), argc, argv)) {
      return kExitUsage;
    }
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (verbose) spdlog::set_level(spdlog::level::info);

  if (*help) {
    if (help_topic.empty()) {  // app.help() would describe the selected command: help itself
      std::fputs(
          app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal).c_str(),
          stdout);
      return kExitOk;
    }
    if (std::find(names.begin(), names.end(), help_topic) == names.end()) {
      return UnknownCommand(help_topic, names);
    }
    std::fputs(app.get_subcommand(help_topic)->help(app.get_name()).c_str(), stdout);
    return kExitOk;
  }
  if (*init) {
    if (objstore::IsS3Uri(store)) return InitS3(store, endpoint, codec, json);
    return Init(store, codec, json);
  }
  if (*upgrade) return Upgrade(store, json);
  if (*put) return Put(store, name, codec, create);
  if (*get) return Get(store, name);
  if (*rm) return Remove(store, name);
  if (*ls) return List(store, json);
  if (*verify) return Verify(store, json);
  if (*gc) {
    if (objstore::IsS3Uri(store)) return GcS3(store, endpoint, grace, json);
    return Gc(store, rewrite_below, json);
  }
  if (*stats) return Stats(store, json);
  if (*log) return Log(store, version, json);
  if (*forget) return Forget(store, keep_last, keep_every, dry_run, json);
  if (*status) return ShowStatus(json);
  if (*diff) return Diff(store, v1, v2, json);
  if (*export_) return Export(name, dest, to, dtype, json);
  if (*restore) return Restore(store, version, dest, json);
  if (*advise) return Advise(store, mtbf, save_seconds, json);
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
    if (forward_deltas) margs.reverse_deltas = false;
    if (compress_at_write) margs.compress_behind = false;
    margs.snapshot_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(snapshot_timeout * 1000));
    for (const auto& list : mount_options) {
      if (Status st = ApplyMountOptions(list, &margs); !st.ok()) return Fail(st);
    }
    if (margs.keep_every > 0 && margs.keep_last == 0) {
      return Fail(Status::InvalidArgument("--keep-every needs --keep-last"),
                  "e.g. `--keep-last 3 --keep-every 10`");
    }
    if (objstore::IsS3Uri(margs.store)) {
      if (cache_dir.empty()) {
        return Fail(Status::InvalidArgument("an s3:// store needs --cache-dir DIR"),
                    "e.g. `ckptfs mount " + margs.store + " MNT --cache-dir /var/cache/ckptfs`");
      }
      margs.s3_location = margs.store;
      margs.store = cache_dir;
      if (margs.world_size < 0 || margs.rank < 0 ||
          (margs.world_size > 0 && margs.rank >= margs.world_size) || !(remote_poll > 0)) {
        return Fail(Status::InvalidArgument("--rank must lie in [0, --world-size) and "
                                            "--remote-poll be positive"),
                    "e.g. `--rank 1 --world-size 4 --remote-poll 5`");
      }
      margs.remote_poll = std::chrono::milliseconds(static_cast<int64_t>(remote_poll * 1000));
    } else if (!cache_dir.empty() || !margs.s3_endpoint.empty() || !margs.node.empty() ||
               margs.world_size != 0) {
      return Fail(
          Status::InvalidArgument("--cache-dir, --endpoint, --node and --world-size "
                                  "are for s3:// stores"));
    }
    if (margs.foreground) spdlog::set_level(spdlog::level::info);
    return Mount(margs);
  }
  if (*umount) return Umount(mountpoint);
  if (*sync) return Sync(mountpoint);
  if (*seal) return Seal(version);
  if (*file_versions) return FileVersions(marked_dir, !file_versions_off);
  return kExitUsage;
}
