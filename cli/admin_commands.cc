// verify, gc, stats, log, forget, status (cli/admin_commands.h).
#include "cli/admin_commands.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/admin_client.h"
#include "cli/advise.h"
#include "cli/progress.h"

namespace ckptfs::cli {
namespace {

using nlohmann::json;

unsigned long long U(const json& v) { return v.is_number() ? v.get<unsigned long long>() : 0; }

// Where the answer came from, added to every --json document.
void Describe(const Target& t, json* doc) {
  (*doc)["store"] = RealPath(t.store);
  (*doc)["mount"] = t.mount ? json(t.mount->mountpoint) : json();
}

void PrintGc(const json& r) {
  for (const auto& s : r["skipped"]) std::printf("skipped %s\n", s.get<std::string>().c_str());
  std::printf(
      "gc: dropped %llu chunks, stored %llu deltas whole (their bases went), moved %llu "
      "records, deleted %llu packs, freed %llu bytes in place; pack bytes %llu -> %llu\n",
      U(r["chunks_dropped"]), U(r["deltas_rematerialized"]), U(r["records_moved"]),
      U(r["packs_deleted"]), U(r["pack_bytes_punched"]), U(r["pack_bytes_before"]),
      U(r["pack_bytes_after"]));
}

Result<Target> Resolve(const std::string& target) { return ResolveTarget(target); }

// Runs `request` on `target` (resolved into *t) and adds where the answer came from.
Result<json> Ask(const std::string& target, const json& request, Target* t,
                 const ProgressFn& progress = {}) {
  CKPTFS_ASSIGN_OR_RETURN(*t, Resolve(target));
  CKPTFS_ASSIGN_OR_RETURN(json reply, RunAdminOn(*t, request, progress));
  Describe(*t, &reply);
  return reply;
}

}  // namespace

int Verify(const std::string& target, bool as_json) {
  Target t;
  ProgressLine line("verify", as_json);
  auto r = Ask(target, {{"cmd", "verify"}}, &t, line.Fn());
  line.Done();
  if (!r.ok()) return Fail(r.status());
  bool ok = (*r)["ok"].get<bool>();
  if (as_json) {
    PrintJson(*r);
  } else {
    for (const auto& p : (*r)["problems"]) std::printf("%s\n", p.get<std::string>().c_str());
    // Where the unreadable bytes are: restore those files from elsewhere, or forget the versions.
    for (const auto& d : r->value("damaged", json::array())) {
      std::printf("damaged: version %s, file %s, bytes [%llu, %llu): %s\n",
                  d["version"].get<std::string>().c_str(), d["file"].get<std::string>().c_str(),
                  U(d["offset"]), U(d["offset"].get<uint64_t>() + d["length"].get<uint64_t>()),
                  d["problem"].get<std::string>().c_str());
    }
    const std::string how = t.mount ? "by the daemon of " + t.mount->mountpoint : "offline";
    std::printf(
        "verify: %llu chunks, %llu contents of %s checked %s: %s\n", U((*r)["chunks_checked"]),
        U((*r)["contents_checked"]), t.store.c_str(), how.c_str(),
        ok ? "no problems" : (std::to_string((*r)["problems"].size()) + " problems").c_str());
  }
  return ok ? kExitOk : kExitFailure;
}

int Gc(const std::string& target, double rewrite_below, bool as_json) {
  Target t;
  ProgressLine line("gc", as_json);
  auto r = Ask(target, {{"cmd", "gc"}, {"rewrite_below", rewrite_below}}, &t, line.Fn());
  line.Done();
  if (!r.ok()) return Fail(r.status());
  if (as_json) {
    PrintJson(*r);
    return kExitOk;
  }
  PrintGc(*r);
  return kExitOk;
}

int Stats(const std::string& target, bool as_json) {
  Target t;
  auto r = Ask(target, {{"cmd", "stats"}}, &t);
  if (!r.ok()) return Fail(r.status());
  if (as_json) {
    PrintJson(*r);
    return kExitOk;
  }
  // "label value" lines, one number each (scripts parse them; --json is the stable form).
  static constexpr std::pair<const char*, const char*> kLines[] = {
      {"contents", "contents"},
      {"logical bytes", "logical_bytes"},
      {"chunks", "chunks"},
      {"chunk bytes", "chunk_bytes"},
      {"record bytes", "record_bytes"},
      {"pack bytes", "pack_bytes"},
      {"packs", "packs"},
      {"plain chunks", "plain_chunks"},
      {"planes chunks", "planes_chunks"},
      {"delta chunks", "delta_chunks"},
      {"longest chain", "longest_chain"},
      {"pack read bytes", "pack_read_bytes"},
      {"pack reads", "pack_reads"},
      {"cache hits", "cache_hits"},
      {"cache misses", "cache_misses"},
      {"prefetch loads", "prefetch_loads"},
      {"read loads", "read_loads"}};
  for (const auto& [label, key] : kLines) std::printf("%-15s %llu\n", label, U((*r)[key]));
  if (U((*r)["logical_bytes"]) > 0) {
    std::printf("stored/logical %.4f\n", (*r)["stored_over_logical"].get<double>());
  }
  const json& d = (*r)["daemon"];
  if (d.is_null()) return kExitOk;  // offline: no daemon, nothing it counts
  std::printf("bytes written   %llu\nbytes read      %llu\n", U(d["bytes_written"]),
              U(d["bytes_read"]));
  for (const char* op : {"read", "write", "fsync"}) {
    const json& l = d["latency"][op];
    std::printf("%-5s latency   %llu calls, p50 %.1f us, p99 %.1f us\n", op, U(l["count"]),
                l["p50_us"].get<double>(), l["p99_us"].get<double>());
  }
  std::printf(
      "queued commits  %llu\npending bytes   %llu\njournaled       %llu files, %llu bytes\n",
      U(d["queued_commits"]), U(d["pending_bytes"]), U(d["journaled_files"]),
      U(d["journaled_bytes"]));
  for (const auto& [role, seconds] : d["cpu_seconds"].items()) {
    std::printf("cpu %-11s %.2f s\n", role.c_str(), seconds.get<double>());
  }
  return kExitOk;
}

int Log(const std::string& target, const std::string& version, bool as_json) {
  json request = {{"cmd", "log"}};
  if (!version.empty()) request["version"] = version;
  Target t;
  auto r = Ask(target, request, &t);
  if (!r.ok()) return Fail(r.status());
  if (as_json) {
    PrintJson(*r);
    return kExitOk;
  }
  const json& versions = (*r)["versions"];
  if (versions.empty()) {
    std::printf("no versions in %s\n", t.store.c_str());
    return kExitOk;
  }
  if (version.empty()) {
    std::printf("%4s  %-24s %-19s  %-6s %5s %11s %11s %7s  %s\n", "SEQ", "NAME", "CREATED",
                "SEALED", "FILES", "LOGICAL", "ADDED", "ADDED%", "STEP/LAYOUT");
  }
  for (const auto& v : versions) {
    const json& m = v["metadata"];
    std::string step = m["global_step"].is_null() ? "-" : std::to_string(U(m["global_step"]));
    std::string layout;  // appended, not " " + s: GCC 12 -Wrestrict misfires on that here
    if (!m["layout"].is_null()) layout.append(" ").append(m["layout"].get<std::string>());
    if (version.empty()) {
      std::printf("%4llu  %-24s %-19s  %-6s %5llu %11s %11s %6.1f%%  %s%s\n", U(v["seq"]),
                  v["name"].get<std::string>().c_str(), HumanTime(U(v["created_unix_ns"])).c_str(),
                  v["sealed"].get<bool>() ? "yes" : "no", U(v["files"]),
                  HumanBytes(U(v["logical_bytes"])).c_str(),
                  HumanBytes(U(v["added_bytes"])).c_str(), 100 * v["ratio"].get<double>(),
                  step.c_str(), layout.c_str());
      continue;
    }
    std::printf("version   %s (seq %llu)\n", v["name"].get<std::string>().c_str(), U(v["seq"]));
    std::printf("created   %s\nsealed    %s\n", HumanTime(U(v["created_unix_ns"])).c_str(),
                v["sealed"].get<bool>() ? "yes" : "no");
    std::printf("files     %llu, %s; added %s to the store (%.1f%%)\n", U(v["files"]),
                HumanBytes(U(v["logical_bytes"])).c_str(), HumanBytes(U(v["added_bytes"])).c_str(),
                100 * v["ratio"].get<double>());
    std::printf("digest    %s\n", v["manifest_digest"].get<std::string>().c_str());
    std::printf("step      %s%s\n", step.c_str(),
                m["step_source"].is_null()
                    ? ""
                    : (" (from " + m["step_source"].get<std::string>() + ")").c_str());
    if (!m["epoch"].is_null()) std::printf("epoch     %llu\n", U(m["epoch"]));
    std::printf("layout    %s\n",
                m["layout"].is_null() ? "-" : m["layout"].get<std::string>().c_str());
    for (const auto& [k, fv] : m["framework"].items()) {
      std::printf("framework %s %s\n", k.c_str(), fv.get<std::string>().c_str());
    }
    for (const auto& f : v["file_list"]) {
      std::string fmt = f["format"].is_null() ? ""
                                              : "  " + f["format"].get<std::string>() + ", " +
                                                    std::to_string(U(f["tensors"])) + " tensors";
      std::printf("  %11s  added %11s  %s%s\n", HumanBytes(U(f["size"])).c_str(),
                  HumanBytes(U(f["added_bytes"])).c_str(), f["path"].get<std::string>().c_str(),
                  fmt.c_str());
    }
  }
  return kExitOk;
}

int Forget(const std::string& target, uint64_t keep_last, uint64_t keep_every, bool dry_run,
           bool as_json) {
  auto t = Resolve(target);
  if (!t.ok()) return Fail(t.status());
  auto plan = RunAdminOn(
      *t, {{"cmd", "forget_plan"}, {"keep_last", keep_last}, {"keep_every", keep_every}});
  if (!plan.ok()) return Fail(plan.status());
  const json kept = (*plan)["kept"], forgotten = (*plan)["forgotten"];
  ProgressLine removing("forget", as_json, ProgressLine::Unit::kVersions);
  removing.SetTotal(dry_run ? 0 : forgotten.size());
  for (const auto& v : forgotten) {
    const std::string name = v["name"].get<std::string>();
    if (dry_run) break;
    removing.Add(0);
    if (t->mount) {  // through the mount, so that the kernel forgets the names too
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::path(t->mount->mountpoint) / name, ec);
      if (ec) return Fail(Status::IOError("remove " + name + ": " + ec.message()));
    } else {
      auto r = RunAdminOn(*t, {{"cmd", "remove_version"}, {"name", name}});
      if (!r.ok()) return Fail(r.status());
    }
    removing.Add(1);
  }
  removing.Done();
  json doc = {{"kept", kept}, {"forgotten", forgotten}, {"dry_run", dry_run}, {"gc", nullptr}};
  if (!dry_run && !forgotten.empty()) {
    ProgressLine line("gc", as_json);
    auto gc = RunAdminOn(*t, {{"cmd", "gc"}}, line.Fn());
    line.Done();
    if (!gc.ok()) return Fail(gc.status());
    doc["gc"] = *gc;
  }
  Describe(*t, &doc);
  if (as_json) {
    PrintJson(doc);
    return kExitOk;
  }
  for (const auto& v : kept) {
    std::printf("keep    %s (%s)\n", v["name"].get<std::string>().c_str(),
                v["reason"].get<std::string>().c_str());
  }
  for (const auto& v : forgotten) {
    std::printf("%s %s\n", dry_run ? "would forget" : "forget ",
                v["name"].get<std::string>().c_str());
  }
  if (!doc["gc"].is_null()) {
    PrintGc(doc["gc"]);
  }
  return kExitOk;
}

int Advise(const std::string& target, const std::string& mtbf_text, double save_seconds,
           bool as_json) {
  auto mtbf = ParseDuration(mtbf_text);
  if (!mtbf.ok()) {
    std::fprintf(stderr, "ckptfs: --mtbf: %s\n", mtbf.status().message().c_str());
    return kExitUsage;
  }
  json doc = {{"store", nullptr}, {"mount", nullptr}, {"measured", json::array()}};
  std::string source = "given";
  if (save_seconds <= 0) {
    if (target.empty()) {
      std::fprintf(stderr,
                   "ckptfs: advise needs a save cost: a STORE or MNT whose versions measure it, "
                   "or --save-seconds S\n");
      return kExitUsage;
    }
    auto t = Resolve(target);
    if (!t.ok()) return Fail(t.status());
    auto r = RunAdminOn(*t, {{"cmd", "save_cost"}});
    if (!r.ok()) return Fail(r.status());
    Describe(*t, &doc);
    const json& measured = (*r)["measured"];
    if (measured.empty()) {
      return Fail(Status::NotFound("nothing measured yet: none of the " +
                                   std::to_string(U((*r)["versions"])) + " versions of " +
                                   t->store + " measures a save"),
                  "a version measures one once it is sealed or a newer one exists, when the job "
                  "wrote it into the mount (not copied in with its times kept); save a few "
                  "checkpoints first, or give the cost of a save with --save-seconds S");
    }
    std::vector<double> costs;
    for (const auto& v : measured) costs.push_back(v["save_seconds"].get<double>());
    std::sort(costs.begin(), costs.end());
    const size_t n = costs.size();
    save_seconds = n % 2 == 1 ? costs[n / 2] : (costs[n / 2 - 1] + costs[n / 2]) / 2;
    doc["measured"] = measured;
    source = "measured";
  }
  const double young = YoungInterval(save_seconds, *mtbf);
  const double daly = DalyInterval(save_seconds, *mtbf);
  doc["mtbf_seconds"] = *mtbf;
  doc["save_seconds"] = save_seconds;
  doc["save_source"] = source;
  doc["young_seconds"] = young;
  doc["daly_seconds"] = daly;
  doc["young_waste"] = ExpectedWaste(young, save_seconds, *mtbf);
  doc["daly_waste"] = ExpectedWaste(daly, save_seconds, *mtbf);
  if (as_json) {
    PrintJson(doc);
    return kExitOk;
  }
  std::printf("checkpoint every %s (Young: sqrt(2 C M)); Daly's higher-order estimate: %s\n",
              HumanDuration(young).c_str(), HumanDuration(daly).c_str());
  if (source == "given") {
    std::printf("  C, one save:  %s (given by --save-seconds)\n",
                HumanDuration(save_seconds).c_str());
  } else {
    std::printf("  C, one save:  %s: the median of %zu versions of %s (%s),\n",
                HumanDuration(save_seconds).c_str(), doc["measured"].size(),
                doc["store"].get<std::string>().c_str(),
                doc["mount"].is_null() ? "read from its catalog" : "asked through its daemon");
    std::printf("                each from its creation to its last file's commit:\n");
    for (const auto& v : doc["measured"]) {
      std::printf("      %-20s %10s in %s (%s/s)\n", v["name"].get<std::string>().c_str(),
                  HumanBytes(U(v["logical_bytes"])).c_str(),
                  HumanDuration(v["save_seconds"].get<double>()).c_str(),
                  HumanBytes(static_cast<uint64_t>(v["bytes_per_second"].get<double>())).c_str());
    }
  }
  std::printf("  M, MTBF:      %s (given by --mtbf)\n", HumanDuration(*mtbf).c_str());
  std::printf(
      "  time lost to saves and to work redone after a failure: about %.1f%% (Young), "
      "%.1f%% (Daly)\n",
      100 * doc["young_waste"].get<double>(), 100 * doc["daly_waste"].get<double>());
  if (save_seconds >= 2 * *mtbf) {
    std::printf("  a save costs more than twice the MTBF: checkpointing cannot keep up\n");
  }
  return kExitOk;
}

int ShowStatus(bool as_json) {
  json mounts = json::array();
  for (const auto& m : CkptfsMounts()) {
    json entry = {{"mountpoint", m.mountpoint}, {"store", m.store}, {"read_only", m.read_only}};
    auto r = RunAdminOn(Target{m.store, m}, {{"cmd", "status"}});
    if (r.ok()) {
      r->erase("store");
      entry["daemon"] = *r;
      entry["error"] = nullptr;
    } else {
      entry["daemon"] = nullptr;
      entry["error"] = r.status().ToString();
    }
    mounts.push_back(entry);
  }
  if (as_json) {
    PrintJson({{"mounts", mounts}});
    return kExitOk;
  }
  if (mounts.empty()) std::printf("no ckptfs mounts\n");
  for (const auto& e : mounts) {
    std::printf("%s  (store %s%s)\n", e["mountpoint"].get<std::string>().c_str(),
                e["store"].get<std::string>().c_str(),
                e["read_only"].get<bool>() ? ", read-only" : "");
    if (e["daemon"].is_null()) {
      std::printf("  daemon: %s\n", e["error"].get<std::string>().c_str());
      continue;
    }
    const json& d = e["daemon"];
    std::printf("  daemon pid %llu, up %.0f s; codec %s, cache %s, delta chain %llu\n", U(d["pid"]),
                d["uptime_seconds"].get<double>(), d["codec"].get<std::string>().c_str(),
                HumanBytes(U(d["cache_bytes"])).c_str(), U(d["delta_chain"]));
    std::printf("  write queue bound %s (peak %s); read from packs %s in %llu reads\n",
                HumanBytes(U(d["inflight_bytes"])).c_str(),
                HumanBytes(U(d["inflight_peak_bytes"])).c_str(),
                HumanBytes(U(d["pack_read_bytes"])).c_str(), U(d["pack_reads"]));
    std::printf("  commits queued %llu; pending durability %s; journaled %s\n",
                U(d["queued_commits"]), HumanBytes(U(d["pending_bytes"])).c_str(),
                HumanBytes(U(d["journaled_bytes"])).c_str());
  }
  return kExitOk;
}

}  // namespace ckptfs::cli
