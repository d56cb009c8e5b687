// engine/namespace/control_server.h
//
// The mount daemon's control socket (STORE/control.sock, mode 0600; the mount's root answers
// the xattr user.ckptfs.control with its path): how the snapshot engine of a training process
// publishes a sharded version without sending its bytes through FUSE. It serves the daemon's
// user, root, and, when a control group is given (mount -o control_group=NAME), the members of
// that group: then the socket is 0660 and the store's root and packs/ 0710 in that group, so
// that members reach the socket and the packs reserved for them (each 0600, owned by the rank's
// user) but can list nothing. Any other peer (SO_PEERCRED) is closed unanswered. Per
// connection, one rank:
//
//   begin {version, rank, world_size}   -> ok        (the name is free; the rank joins)
//   reserve_pack                        -> {pack_id, path}: the rank appends records there
//   commit {file, size, pack_id, pack_length, chunks, shard}
//                                       -> {state: accepted} once its records are checked,
//                                          later {state: complete} once the version is visible
//   admin {cmd, ..., progress?: true}   -> {reply}: the `ckptfs` command's requests (admin.h);
//                                          with progress, first frames {progress: {done,
//                                          total}} (verify, gc: bytes; at most one per 100 ms)
//
// When the last of world_size ranks has committed, the version appears in one transaction
// (FileSystem::AddExternalVersion). A rank whose connection closes before it committed
// abandons the version: every rank's reserved packs are deleted and the ranks waiting get an
// error. A version whose ranks have not all committed `pending_timeout` after its first begin
// (a rank that hangs, or never starts) is abandoned the same way. Protocol details and the
// crash story: docs/snapshot.md.
// Thread-safe; one thread per connection.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/namespace/control_protocol.h"
#include "engine/namespace/filesystem.h"
#include "engine/store/store.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"

namespace ckptfs {

class ControlServer {
 public:
  // Listens on `socket` (a stale socket file there is replaced), for the daemon's user and root,
  // and the members of group `control_gid` when set (see above; the store's directory modes
  // are set either way, so that a mount without the group is private again).
  static Result<std::unique_ptr<ControlServer>> Start(
      FileSystem* fs, Store* store, const std::filesystem::path& socket,
      std::chrono::milliseconds pending_timeout = std::chrono::minutes(30),
      std::optional<uint32_t> control_gid = std::nullopt);
  // Stops accepting, closes every connection (abandoning versions not yet complete) and joins.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  struct Connection;
  struct PendingVersion;
  ControlServer(FileSystem* fs, Store* store, std::filesystem::path path,
                std::chrono::milliseconds pending_timeout, std::optional<uint32_t> control_gid)
      : fs_(fs),
        store_(store),
        path_(std::move(path)),
        pending_timeout_(pending_timeout),
        control_gid_(control_gid) {}
  // Sets the modes (and group) of the store's root, packs/ and the socket.
  Status SetAccess() const;
  // Whether the peer of connection `fd` (SO_PEERCRED uid and gid) may use the socket.
  bool Admits(int fd, uint32_t uid, uint32_t gid) const;
  void AcceptLoop();
  // Abandons the versions pending longer than pending_timeout_, until stopping_.
  void ReapLoop();
  // Marks v abandoned (its waiting ranks get `why`); returns its packs.
  std::vector<uint32_t> AbandonLocked(PendingVersion& v, const std::string& why) REQUIRES(mu_);
  void Serve(std::shared_ptr<Connection> conn);
  // Returns the reply; may block (commit waits for completion and sends two replies itself).
  std::string Handle(Connection& conn, const std::string& request);
  std::string Begin(Connection& conn, const std::string& version, int rank, int world_size);
  std::string ReservePack(Connection& conn);
  std::string Commit(Connection& conn, const RankCommit& commit);
  Status Finalize(PendingVersion& v);
  // Abandons conn's uncommitted version; returns the packs to delete.
  std::vector<uint32_t> LeaveLocked(Connection& conn, const std::string& why) REQUIRES(mu_);
  void DiscardPacks(const std::vector<uint32_t>& packs);

  FileSystem* const fs_;
  Store* const store_;
  const std::filesystem::path path_;
  const std::chrono::milliseconds pending_timeout_;
  const std::optional<uint32_t> control_gid_;
  FileDescriptor listen_fd_;
  std::thread acceptor_;
  std::thread reaper_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<PendingVersion>> pending_ GUARDED_BY(mu_);
  // Abandoned versions, with the connections still attached to them: a begin of the name is
  // refused until they have all gone, so that late ranks do not wait for dead ones.
  std::map<std::string, std::set<Connection*>> abandoned_ GUARDED_BY(mu_);
  std::set<std::shared_ptr<Connection>> conns_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
