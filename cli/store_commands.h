// cli/store_commands.h
//
// Commands on a store directory (the store must not be mounted: its lock is held by the
// daemon; OpenStore says so, naming the mount). docs/cli.md has their output and exit codes.
#pragma once

#include <memory>
#include <string>

#include "cli/cli.h"
#include "engine/store/store.h"

namespace ckptfs::cli {

// Store::Open, with messages that say what to do: `ckptfs init` for a missing store, `ckptfs
// umount MNT` for a mounted one, `ckptfs upgrade` for an older format.
Result<std::unique_ptr<Store>> OpenStore(const std::string& dir, StoreOptions options);
Result<std::unique_ptr<Store>> OpenExistingStore(const std::string& dir);

// put: standard input as NAME; the store must exist unless `create`.
int Put(const std::string& dir, const std::string& name, const std::string& codec, bool create);
int Get(const std::string& dir, const std::string& name);
int Remove(const std::string& dir, const std::string& name);
int List(const std::string& dir, bool json);
// init: a new store in a new or empty directory, its codec recorded in ckptfs.json.
int Init(const std::string& dir, const std::string& codec, bool json);
// `ckptfs init s3://BUCKET/PREFIX [--endpoint URL]`: records a new store's parameters in the
// bucket (created if missing); docs/scale-out.md.
int InitS3(const std::string& location, const std::string& endpoint, const std::string& codec,
           bool json);
// upgrade: the store's format to this ckptfs's (Store::Open with upgrade_format).
// `ckptfs gc s3://BUCKET/PREFIX [--grace SECONDS]`: mark and sweep over the bucket's manifests
// (BucketMirror::CollectGarbage).
int GcS3(const std::string& location, const std::string& endpoint, double grace_seconds,
         bool json);
int Upgrade(const std::string& dir, bool json);

}  // namespace ckptfs::cli
