// engine/namespace/retention.h
//
// Rotation as versions seal: a mount started with `--keep-last N [--keep-every K]` (or
// `-o keep_last=N,keep_every=K`) forgets, each time a version seals, the sealed versions the
// rules of `ckptfs forget` do not keep, then runs gc once — the same requests the command
// sends (admin.h: forget_plan, remove_version, gc), on a thread of its own, so that the seal
// that triggered it does not wait (docs/cli.md "forget").
//
//   auto retention = Retention::Start(store, fs, {.keep_last = 3}, [&](Ino parent, auto& name) {
//     fuse_lowlevel_notify_inval_entry(se, parent, name.data(), name.size());
//   });
//   fs->SetOnSealed([r = retention.get()] { r->Notify(); });
//
// Seals that arrive during a pass cause one more pass. Failures are logged (the next seal
// tries again); nothing is removed that the rules keep. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "engine/namespace/filesystem.h"
#include "engine/store/store.h"
#include "engine/util/mutex.h"

namespace ckptfs {

struct RetentionPolicy {
  uint64_t keep_last = 0;   // >= 1
  uint64_t keep_every = 0;  // 0: none
};

class Retention {
 public:
  // Called after a version's entry `name` in directory `parent` was removed (the daemon tells
  // the kernel to forget the name).
  using RemovedFn = std::function<void(Ino parent, const std::string& name)>;
  // REQUIRES: policy.keep_last >= 1; store and fs outlive the Retention.
  static std::unique_ptr<Retention> Start(Store* store, FileSystem* fs, RetentionPolicy policy,
                                          RemovedFn on_removed);
  // Finishes a pass in progress, then joins.
  ~Retention();
  Retention(const Retention&) = delete;
  Retention& operator=(const Retention&) = delete;

  // A version sealed: a pass runs soon. Cheap; never blocks on a pass.
  void Notify();
  // Passes finished so far (tests).
  uint64_t passes() const;

 private:
  Retention(Store* store, FileSystem* fs, RetentionPolicy policy, RemovedFn on_removed)
      : store_(store), fs_(fs), policy_(policy), on_removed_(std::move(on_removed)) {}
  void Run();
  // One rotation: plan, remove what it forgets, gc if anything went.
  Status Pass();

  Store* const store_;
  FileSystem* const fs_;
  const RetentionPolicy policy_;
  const RemovedFn on_removed_;
  mutable Mutex mu_;
  CondVar cv_;
  bool pending_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t passes_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace ckptfs
