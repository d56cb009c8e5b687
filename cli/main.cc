// The `ckptfs` command. Each subcommand opens the store, does one thing, and reports what
// happened in words; exit status 0 on success, 1 on failure, 2 on a usage error.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "engine/store/content_writer.h"
#include "engine/store/store.h"

namespace ckptfs {
namespace {

constexpr size_t kIoBytes = 4 << 20;

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
  auto spec = CodecSpec::Parse(codec);
  if (!spec.ok()) return Fail(spec.status());
  options.codec = *spec;
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

int Gc(const std::string& dir, double rewrite_below) {
  auto store = OpenExisting(dir);
  if (!store.ok()) return Fail(store.status());
  GcOptions options;
  options.rewrite_below = rewrite_below;
  auto report = (*store)->Gc(options);
  if (!report.ok()) return Fail(report.status());
  for (const auto& s : report->skipped) std::printf("skipped %s\n", s.c_str());
  std::printf(
      "gc: dropped %llu chunks, moved %llu records, deleted %llu packs; "
      "pack bytes %llu -> %llu\n",
      static_cast<unsigned long long>(report->chunks_dropped),
      static_cast<unsigned long long>(report->records_moved),
      static_cast<unsigned long long>(report->packs_deleted),
      static_cast<unsigned long long>(report->pack_bytes_before),
      static_cast<unsigned long long>(report->pack_bytes_after));
  return 0;
}

int Stats(const std::string& dir) {
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
  if (st->logical_bytes > 0) {
    std::printf("stored/logical %.4f\n",
                static_cast<double>(st->pack_bytes) / static_cast<double>(st->logical_bytes));
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
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "log what the store does");
  std::string store, name, codec = "lz4";
  double rewrite_below = 0.5;

  auto* put = app.add_subcommand("put", "store standard input as NAME (replacing it)");
  put->add_option("STORE", store, "store directory (created if missing)")->required();
  put->add_option("NAME", name, "name to store it under")->required();
  put->add_option("--codec", codec, "none, lz4, zstd or zstd:LEVEL")->capture_default_str();
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
  auto* gc = app.add_subcommand("gc", "free unreferenced chunks and compact packs");
  gc->add_option("STORE", store)->required();
  gc->add_option("--rewrite-below", rewrite_below,
                 "rewrite packs whose live fraction is below this")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  auto* stats = app.add_subcommand("stats", "logical vs stored bytes");
  stats->add_option("STORE", store)->required();

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
  return 2;
}
