#include "engine/namespace/control_server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/namespace/admin.h"
#include "engine/namespace/control_protocol.h"
#include "engine/util/thread_role.h"

namespace ckptfs {
namespace {

using nlohmann::json;

// How often an admin request asked with progress sends a progress frame (at most).
constexpr std::chrono::milliseconds kAdminProgressInterval(100);

std::string Ok(json extra = json::object()) {
  extra["ok"] = true;
  return extra.dump();
}

std::string Error(const Status& s) { return json{{"ok", false}, {"error", s.ToString()}}.dump(); }

}  // namespace

struct ControlServer::Connection {
  FileDescriptor fd;
  Caller peer;
  // The version this rank works on (empty: none).
  std::string version;
  int rank = -1;
  bool committed = false;
  std::vector<uint32_t> reserved;  // packs not yet handed over with a commit
  std::shared_ptr<PendingVersion> pending;
};

struct ControlServer::PendingVersion {
  std::string name;
  int world_size = 0;
  std::vector<bool> begun;
  std::vector<std::optional<FileSystem::ExternalFile>> parts;
  std::vector<json> shards;
  int committed = 0;
  Caller owner;
  std::set<Connection*> members;
  bool done = false;
  Status result;  // when done
  std::chrono::steady_clock::time_point begun_at = std::chrono::steady_clock::now();
};

Result<std::unique_ptr<ControlServer>> ControlServer::Start(
    FileSystem* fs, Store* store, const std::filesystem::path& socket,
    std::chrono::milliseconds pending_timeout, std::optional<uint32_t> control_gid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.string().size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("control socket path too long: " + socket.string());
  }
  std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
  std::unique_ptr<ControlServer> server(
      new ControlServer(fs, store, socket, pending_timeout, control_gid));
  server->listen_fd_ = FileDescriptor(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!server->listen_fd_.valid()) return Status::FromErrno(errno, "socket");
  ::unlink(socket.c_str());  // a stale socket of an earlier daemon
  if (::bind(server->listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno(errno, "bind " + socket.string());
  }
  CKPTFS_RETURN_IF_ERROR(server->SetAccess());
  if (::listen(server->listen_fd_.get(), 64) != 0) return Status::FromErrno(errno, "listen");
  server->acceptor_ = std::thread([p = server.get()] { p->AcceptLoop(); });
  server->reaper_ = std::thread([p = server.get()] { p->ReapLoop(); });
  if (control_gid) {
    spdlog::info("control socket at {}, for uid {} and group {}", socket.string(), ::geteuid(),
                 *control_gid);
  } else {
    spdlog::info("control socket at {}, for uid {}", socket.string(), ::geteuid());
  }
  return server;
}

Status ControlServer::SetAccess() const {
  const std::filesystem::path dirs[] = {store_->dir(), store_->dir() / "packs"};
  const mode_t dir_mode = control_gid_ ? 0710 : 0700;
  const mode_t socket_mode = control_gid_ ? 0660 : 0600;
  for (const auto& p : {dirs[0], dirs[1], path_}) {
    if (control_gid_ && ::chown(p.c_str(), static_cast<uid_t>(-1), *control_gid_) != 0) {
      return Status::FromErrno(errno, "chgrp " + std::to_string(*control_gid_) + " " +
                                          p.string() +
                                          " (control_group: the daemon's user must be root or "
                                          "a member of the group)");
    }
    if (::chmod(p.c_str(), p == path_ ? socket_mode : dir_mode) != 0) {
      return Status::FromErrno(errno, "chmod " + p.string());
    }
  }
  return Status::OK();
}

bool ControlServer::Admits(int fd, uint32_t uid, uint32_t gid) const {
  if (uid == ::geteuid() || uid == 0) return true;
  if (!control_gid_) return false;
  if (gid == *control_gid_) return true;
  // The peer's supplementary groups, as they were when it connected.
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      break;
    }
    if (errno != ERANGE || len / sizeof(gid_t) <= groups.size()) return false;
    groups.resize(len / sizeof(gid_t));
  }
  return std::find(groups.begin(), groups.end(), *control_gid_) != groups.end();
}

ControlServer::~ControlServer() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (const auto& c : conns_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  cv_.NotifyAll();
  ::shutdown(listen_fd_.get(), SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (reaper_.joinable()) reaper_.join();
  {
    MutexLock lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  ::unlink(path_.c_str());
}

void ControlServer::ReapLoop() {
  const auto tick = std::clamp<std::chrono::milliseconds>(
      pending_timeout_ / 4, std::chrono::milliseconds(50), std::chrono::seconds(5));
  MutexLock lock(mu_);
  while (!stopping_) {
    cv_.WaitFor(lock, tick);
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<PendingVersion>> late;
    for (const auto& [name, v] : pending_) {
      if (!v->done && now - v->begun_at > pending_timeout_) late.push_back(v);
    }
    if (late.empty()) continue;
    std::vector<uint32_t> discard;
    for (const auto& v : late) {
      const std::string why = std::to_string(v->committed) + " of " +
                              std::to_string(v->world_size) + " ranks committed within " +
                              std::to_string(pending_timeout_.count() / 1000.0) +
                              " s (mount --snapshot-timeout)";
      for (uint32_t id : AbandonLocked(*v, why)) discard.push_back(id);
    }
    lock.Unlock();
    cv_.NotifyAll();
    DiscardPacks(discard);
    lock.Lock();
  }
}

void ControlServer::AcceptLoop() {
  SetThreadRole("control");
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    auto conn = std::make_shared<Connection>();
    conn->fd = FileDescriptor(fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        !Admits(fd, cred.uid, cred.gid)) {
      // Whatever the socket's mode says (docs/threat-model.md).
      spdlog::warn("control socket: refused a connection from uid {} (pid {}): only uid {}{} "
                   "may connect (mount -o control_group=NAME lets a group in)",
                   cred.uid, cred.pid, ::geteuid(),
                   control_gid_ ? " and group " + std::to_string(*control_gid_) : "");
      continue;  // conn's destructor closes fd
    }
    conn->peer = Caller{cred.uid, cred.gid};
    MutexLock lock(mu_);
    if (stopping_) return;
    conns_.insert(conn);
    threads_.emplace_back([this, conn] { Serve(conn); });
  }
}

void ControlServer::Serve(std::shared_ptr<Connection> conn) {
  for (;;) {
    auto request = RecvFrame(conn->fd.get());
    if (!request.ok() || !*request) break;
    std::string reply = Handle(*conn, **request);
    if (!reply.empty() && !SendFrame(conn->fd.get(), reply).ok()) break;
  }
  std::vector<uint32_t> discard;
  {
    MutexLock lock(mu_);
    discard = LeaveLocked(
        *conn, "rank " + std::to_string(conn->rank) + " disconnected before it committed");
    conns_.erase(conn);
  }
  cv_.NotifyAll();
  DiscardPacks(discard);
}

std::string ControlServer::Handle(Connection& conn, const std::string& request) {
  Result<ControlRequest> req = DecodeControlRequest(request);
  if (!req.ok()) return Error(req.status());
  switch (req->op) {
    case ControlRequest::Op::kBegin:
      return Begin(conn, req->version, static_cast<int>(req->rank),
                   static_cast<int>(req->world_size));
    case ControlRequest::Op::kReservePack:
      return ReservePack(conn);
    case ControlRequest::Op::kCommit:
      return Commit(conn, req->commit);
    case ControlRequest::Op::kAdmin: {  // the ckptfs command's requests (admin.h)
      ProgressFn progress;
      ProgressThrottle throttle(kAdminProgressInterval);
      bool peer_gone = false;
      if (req->admin_progress) {  // frames {ok, progress: {done, total}} until the reply
        progress = [&](uint64_t done, uint64_t total) {
          if (peer_gone || !throttle.Due(done, total)) return;
          peer_gone = !SendFrame(conn.fd.get(),
                                 Ok({{"progress", {{"done", done}, {"total", total}}}}))
                           .ok();
        };
      }
      auto reply =
          RunAdmin(store_, fs_, json::parse(req->admin_json, nullptr, false), progress);
      return reply.ok() ? Ok({{"reply", *reply}}) : Error(reply.status());
    }
  }
  return Error(Status::InvalidArgument("unknown op"));
}

std::string ControlServer::Begin(Connection& conn, const std::string& version, int rank,
                                 int world_size) {
  Status free = fs_->CheckVersionNameFree(version);
  if (!free.ok()) return Error(free);
  std::vector<uint32_t> discard;
  std::string reply;
  {
    MutexLock lock(mu_);
    // An earlier version this connection did not commit is abandoned.
    discard = LeaveLocked(conn, "rank " + std::to_string(conn.rank) + " began another version");
    auto dead = abandoned_.find(version);
    if (dead != abandoned_.end()) {
      reply = Error(Status::Busy("version " + version + " was abandoned (a rank failed) and " +
                                 std::to_string(dead->second.size()) +
                                 " of its ranks are still connected; retry under a new name"));
    } else {
      auto& v = pending_[version];
      if (!v) {
        v = std::make_shared<PendingVersion>();
        v->name = version;
        v->world_size = world_size;
        v->begun.assign(world_size, false);
        v->parts.resize(world_size);
        v->shards.resize(world_size);
      }
      if (v->world_size != world_size) {
        reply = Error(Status::InvalidArgument("version " + version + " has world size " +
                                              std::to_string(v->world_size)));
      } else if (v->begun[rank]) {
        reply = Error(Status::AlreadyExists("rank " + std::to_string(rank) + " of " + version +
                                            " already began"));
      } else {
        v->begun[rank] = true;
        v->members.insert(&conn);
        conn.version = version;
        conn.rank = rank;
        conn.committed = false;
        conn.pending = v;
        // The writer bounds its delta chains by the store's.
        reply = json{{"ok", true}, {"max_delta_chain", store_->options().max_delta_chain}}.dump();
      }
    }
  }
  cv_.NotifyAll();
  DiscardPacks(discard);
  return reply;
}

std::string ControlServer::ReservePack(Connection& conn) {
  {
    MutexLock lock(mu_);
    if (!conn.pending || conn.committed) {
      return Error(Status::InvalidArgument("reserve_pack needs a begun, uncommitted version"));
    }
  }
  auto pack = store_->CreateExternalPack(conn.peer.uid, conn.peer.gid);
  if (!pack.ok()) return Error(pack.status());
  MutexLock lock(mu_);
  conn.reserved.push_back(pack->first);
  return Ok({{"pack_id", pack->first}, {"path", pack->second.string()}});
}

std::string ControlServer::Commit(Connection& conn, const RankCommit& commit) {
  std::shared_ptr<PendingVersion> v;
  {
    MutexLock lock(mu_);
    if (!conn.pending || conn.committed) {
      return Error(Status::InvalidArgument("commit needs a begun, uncommitted version"));
    }
    v = conn.pending;
  }
  const std::string expected_name = "rank_" + std::to_string(conn.rank) + ".safetensors";
  if (commit.file_name != expected_name) {
    return Error(Status::InvalidArgument("commit of rank " + std::to_string(conn.rank) +
                                         " names its file " + expected_name));
  }
  {
    MutexLock lock(mu_);
    if (std::find(conn.reserved.begin(), conn.reserved.end(), commit.pack_id) ==
        conn.reserved.end()) {
      return Error(Status::InvalidArgument("pack " + std::to_string(commit.pack_id) +
                                           " was not reserved by this connection"));
    }
  }
  FileSystem::ExternalFile file;
  file.name = commit.file_name;
  file.size = commit.size;
  file.pack_id = commit.pack_id;
  for (const CommitChunk& c : commit.chunks) {
    Store::AdoptedChunk a;
    a.id = c.id;
    a.raw_len = c.raw_len;
    if (c.stored) a.record = PackLocation{file.pack_id, c.offset, c.length};
    file.chunks.push_back(a);
  }
  const uint64_t pack_length = commit.pack_length;
  // The records are checked outside the lock: other ranks commit meanwhile.
  Status checked = store_->CheckExternalPack(file.pack_id, pack_length, &file.chunks);
  if (!checked.ok()) return Error(checked);
  file.pack_length = pack_length > kPackHeaderBytes ? pack_length : 0;
  std::vector<uint32_t> discard;
  bool last = false;
  {
    MutexLock lock(mu_);
    if (v->done)
      return Error(v->result.ok() ? Status::InvalidArgument("already complete") : v->result);
    for (uint32_t id : conn.reserved) {  // packs reserved but not used by the commit
      if (id != file.pack_id || file.pack_length == 0) discard.push_back(id);
    }
    conn.reserved.clear();
    if (file.pack_length == 0) file.pack_id = 0;
    v->parts[conn.rank] = std::move(file);
    v->shards[conn.rank] = json::parse(commit.shard_json, nullptr, false);
    if (conn.rank == 0) v->owner = conn.peer;
    conn.committed = true;
    last = ++v->committed == v->world_size;
  }
  DiscardPacks(discard);
  if (!SendFrame(conn.fd.get(), Ok({{"state", "accepted"}})).ok()) return "";
  if (last) {
    Status s = Finalize(*v);
    std::vector<uint32_t> packs;
    {
      MutexLock lock(mu_);
      v->done = true;
      v->result = s;
      pending_.erase(v->name);
      if (!s.ok()) {
        for (const auto& part : v->parts) {
          if (part && part->pack_id != 0) packs.push_back(part->pack_id);
        }
      }
    }
    cv_.NotifyAll();
    DiscardPacks(packs);
    if (s.ok())
      spdlog::info("version {} of {} ranks published", v->name, v->world_size);
    else
      spdlog::error("version {} could not be published: {}", v->name, s.ToString());
  }
  MutexLock lock(mu_);
  while (!v->done && !stopping_) cv_.Wait(lock);
  if (!v->done) return Error(Status::Busy("the daemon is shutting down"));
  v->members.erase(&conn);
  conn.pending.reset();
  conn.version.clear();
  if (!v->result.ok()) return Error(v->result);
  return Ok({{"state", "complete"}});
}

Status ControlServer::Finalize(PendingVersion& v) {
  std::vector<FileSystem::ExternalFile> files;
  json manifest = {{"format", "ckptfs-sharded-1"},
                   {"version", v.name},
                   {"world_size", v.world_size},
                   {"ranks", json::array()}};
  {
    MutexLock lock(mu_);
    for (int r = 0; r < v.world_size; ++r) {
      files.push_back(*v.parts[r]);
      manifest["ranks"].push_back(v.shards[r]);
    }
  }
  return fs_->AddExternalVersion(v.name, files, manifest.dump(1) + "\n", v.owner);
}

std::vector<uint32_t> ControlServer::LeaveLocked(Connection& conn, const std::string& why) {
  std::vector<uint32_t> discard = std::move(conn.reserved);
  conn.reserved.clear();
  for (auto it = abandoned_.begin(); it != abandoned_.end();) {
    it->second.erase(&conn);
    it = it->second.empty() ? abandoned_.erase(it) : std::next(it);
  }
  std::shared_ptr<PendingVersion> v = std::move(conn.pending);
  conn.pending.reset();
  if (!v || v->done) return discard;
  v->members.erase(&conn);
  if (conn.committed) return discard;  // its part stays: the others may still complete
  for (uint32_t id : AbandonLocked(*v, why)) discard.push_back(id);
  return discard;
}

std::vector<uint32_t> ControlServer::AbandonLocked(PendingVersion& v, const std::string& why) {
  // No rank's part will ever be published.
  spdlog::warn("version {} abandoned: {}", v.name, why);
  std::vector<uint32_t> discard;
  v.done = true;
  v.result = Status::Busy("version " + v.name + " abandoned: " + why);
  for (auto& part : v.parts) {
    if (part && part->pack_id != 0) discard.push_back(part->pack_id);
    part.reset();
  }
  pending_.erase(v.name);
  if (!v.members.empty()) abandoned_[v.name] = v.members;
  return discard;
}

void ControlServer::DiscardPacks(const std::vector<uint32_t>& packs) {
  for (uint32_t id : packs) {
    Status s = store_->DiscardExternalPack(id);
    if (!s.ok()) spdlog::error("discarding pack {}: {}", id, s.ToString());
  }
}

}  // namespace ckptfs
