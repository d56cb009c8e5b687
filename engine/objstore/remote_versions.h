// engine/objstore/remote_versions.h
//
// Versions across nodes (docs/scale-out.md): every node of a training job mounts the same
// s3:// store with its own cache; each rank's node writes its files of a version (a top-level
// directory) through its own mount. Once the version is sealed there, the node publishes
// (BucketMirror) and then writes its part:
//
//   PREFIX/versions/<version>/rank-<r>-of-<n>   {node, seq: the manifest that holds the
//                                                files, files: [names]}
//
// Every mount polls PREFIX/versions/ and, for a version it does not hold whose n parts all
// exist, adds it to its namespace in one catalog transaction (FileSystem::AddExternalVersion):
// the files of every part, whose chunks point at the owning nodes' records, read on demand
// (RemotePacks) with the version's manifest.json listing the parts. A version is therefore
// visible on a mount only once every rank committed and published it, and whole or not at all.
//
//   RemoteVersionsOptions opts{.rank = 0, .world_size = 2, .poll = 5s};
//   auto versions = RemoteVersions::Start(&s3, mirror, store, fs, remote, opts);
//
// Guarantees:
// - A part is written only after the publication that holds the version's files returned:
//   the part names a manifest (and so a catalog image and segments) that exists.
// - An import makes the other nodes' packs remote packs of this store (RemotePacks::AddPacks,
//   synced) before the catalog transactions that point chunk rows at them.
// - Files of a version's subdirectories are not carried (a part lists the regular files
//   directly in the version); a name taken on this mount is left alone (a writer sees its own
//   part only).
// Thread-safe; one thread polls until the object is destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/objstore/bucket_mirror.h"
#include "engine/objstore/remote_packs.h"
#include "engine/objstore/s3_client.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs {
class FileSystem;
class Store;
}  // namespace ckptfs

namespace ckptfs::objstore {

struct RemoteVersionsOptions {
  // This node's rank among world_size; world_size 0: this node writes no parts (it reads).
  int rank = 0;
  int world_size = 0;
  std::chrono::milliseconds poll{std::chrono::seconds(5)};
};

// One rank's part of a version, as written in the bucket.
struct VersionPart {
  std::string version;
  int rank = 0;
  int world_size = 0;
  std::string node;
  uint64_t seq = 0;
  std::vector<std::string> files;
};

class RemoteVersions {
 public:
  // REQUIRES: every pointer outlives the result.
  static std::unique_ptr<RemoteVersions> Start(S3Client* s3, BucketMirror* mirror, Store* store,
                                               FileSystem* fs, RemotePacks* remote,
                                               RemoteVersionsOptions options);
  ~RemoteVersions();  // stops the poller

  // One round now: announce this node's sealed versions, import complete ones.
  Status PollOnce();

  // The key of a part, and every part under loc (those that parse).
  static std::string PartKey(const S3Location& loc, const std::string& version, int rank,
                             int world_size);
  // `known` (may be null): parts read before, by key (parts are written once, never changed);
  // the parts read now are added to it.
  static Result<std::vector<VersionPart>> ListParts(
      S3Client& s3, const S3Location& loc, std::map<std::string, VersionPart>* known = nullptr);

 private:
  RemoteVersions(S3Client* s3, BucketMirror* mirror, Store* store, FileSystem* fs,
                 RemotePacks* remote, RemoteVersionsOptions options);
  // Writes this rank's part of each sealed local version not in `skip`.
  Status Announce(const std::set<std::string>& skip);
  Status Import(const std::string& version, const std::vector<VersionPart>& parts);
  void Loop();

  S3Client* const s3_;
  BucketMirror* const mirror_;
  Store* const store_;
  FileSystem* const fs_;
  RemotePacks* const remote_;
  const RemoteVersionsOptions options_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  Mutex poll_mu_;  // one round at a time
  std::set<std::string> failed_ GUARDED_BY(poll_mu_);  // imports that failed (logged once)
  std::map<std::string, VersionPart> known_ GUARDED_BY(poll_mu_);  // parts read, by key
  std::thread thread_;
};

}  // namespace ckptfs::objstore
