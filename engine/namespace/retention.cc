#include "engine/namespace/retention.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "engine/namespace/admin.h"
#include "engine/util/thread_role.h"

namespace ckptfs {

std::unique_ptr<Retention> Retention::Start(Store* store, FileSystem* fs, RetentionPolicy policy,
                                            RemovedFn on_removed) {
  std::unique_ptr<Retention> r(new Retention(store, fs, policy, std::move(on_removed)));
  r->thread_ = std::thread([p = r.get()] {
    SetThreadRole("retain");
    p->Run();
  });
  return r;
}

Retention::~Retention() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void Retention::Notify() {
  {
    MutexLock lock(mu_);
    pending_ = true;
  }
  cv_.NotifyAll();
}

uint64_t Retention::passes() const {
  MutexLock lock(mu_);
  return passes_;
}

void Retention::Run() {
  for (;;) {
    {
      MutexLock lock(mu_);
      while (!stopping_ && !pending_) cv_.Wait(lock);
      if (stopping_) return;
      pending_ = false;
    }
    if (Status s = Pass(); !s.ok()) {
      spdlog::error("retention (keep last {}): {}; the next seal tries again", policy_.keep_last,
                    s.ToString());
    }
    MutexLock lock(mu_);
    ++passes_;
  }
}

Status Retention::Pass() {
  using nlohmann::json;
  CKPTFS_ASSIGN_OR_RETURN(json plan, RunAdmin(store_, fs_,
                                              {{"cmd", "forget_plan"},
                                               {"keep_last", policy_.keep_last},
                                               {"keep_every", policy_.keep_every}}));
  uint64_t removed = 0;
  for (const json& v : plan["forgotten"]) {
    const std::string name = v["name"].get<std::string>();
    CKPTFS_ASSIGN_OR_RETURN(json r,
                            RunAdmin(store_, fs_, {{"cmd", "remove_version"}, {"name", name}}));
    spdlog::info("retention: forgot version {} (keep last {}, every {})", name, policy_.keep_last,
                 policy_.keep_every);
    if (on_removed_) on_removed_(r["parent"].get<Ino>(), r["entry"].get<std::string>());
    ++removed;
  }
  if (removed == 0) return Status::OK();
  // The re-encoder may still be turning the newest versions' pieces around: its commit drops
  // the reference a forgotten version's piece held as the base of the next version's delta
  // (reencode.cc). A gc that ran between dropping unreferenced chunks and that commit would
  // leave the piece for a gc that no seal may ever start (cli_retention kept 3.5 MB of packs).
  // So gc runs once the re-encoder has caught up with what is committed.
  store_->WaitReencoded();
  CKPTFS_ASSIGN_OR_RETURN(json gc, RunAdmin(store_, fs_, {{"cmd", "gc"}}));
  spdlog::info("retention: gc after forgetting {} versions: dropped {} chunks, pack bytes {} -> {}",
               removed, gc["chunks_dropped"].get<uint64_t>(),
               gc["pack_bytes_before"].get<uint64_t>(), gc["pack_bytes_after"].get<uint64_t>());
  return Status::OK();
}

}  // namespace ckptfs
