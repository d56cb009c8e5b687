// Admin requests through the daemon or on the store itself (cli/admin_client.h).
#include "cli/admin_client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>

#include "cli/store_commands.h"
#include "engine/namespace/admin.h"
#include "engine/namespace/control_protocol.h"
#include "engine/namespace/filesystem.h"
#include "engine/util/file.h"

namespace ckptfs::cli {
namespace {

Result<nlohmann::json> ThroughDaemon(const MountEntry& mount, nlohmann::json request,
                                     const ProgressFn& progress) {
  char path[256] = {0};
  ssize_t n = ::getxattr(mount.mountpoint.c_str(), "user.ckptfs.control", path, sizeof(path) - 1);
  if (n <= 0) {
    return Status::FromErrno(errno, "find the control socket of the mount " + mount.mountpoint);
  }
  const std::string socket_path =
      DaemonPath(mount.mountpoint, std::string(path, static_cast<size_t>(n)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("control socket path too long: " + socket_path);
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  FileDescriptor fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::FromErrno(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno(errno,
                             "connect to the daemon of " + mount.mountpoint + " at " + socket_path);
  }
  request["op"] = "admin";
  if (progress) request["progress"] = true;
  CKPTFS_RETURN_IF_ERROR(SendFrame(fd.get(), request.dump()));
  nlohmann::json doc;
  for (;;) {  // progress frames, then the reply
    CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> reply, RecvFrame(fd.get()));
    if (!reply) return Status::IOError("the daemon of " + mount.mountpoint + " closed the socket");
    doc = nlohmann::json::parse(*reply, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object()) return Status::IOError("the daemon sent no JSON object");
    if (!doc.contains("progress")) break;
    const nlohmann::json& p = doc["progress"];
    if (progress && p.is_object() && p.value("total", uint64_t{0}) > 0) {
      progress(p.value("done", uint64_t{0}), p.value("total", uint64_t{0}));
    }
  }
  if (!doc.value("ok", false)) {
    return Status::IOError(doc.value("error", std::string("the daemon refused the request")));
  }
  if (!doc.contains("reply") || !doc["reply"].is_object()) {
    return Status::IOError("the daemon of " + mount.mountpoint + " sent no reply");
  }
  return doc["reply"];
}

}  // namespace

Result<nlohmann::json> RunAdminOn(const Target& target, nlohmann::json request,
                                  const ProgressFn& progress) {
  if (target.mount) return ThroughDaemon(*target.mount, std::move(request), progress);
  CKPTFS_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenExistingStore(target.store));
  std::unique_ptr<FileSystem> fs;
  if (request.value("cmd", "") == "remove_version") {
    FileSystemOptions options;
    options.seal_after = std::chrono::milliseconds(0);
    options.spool_backlog_bytes = 0;
    CKPTFS_ASSIGN_OR_RETURN(fs, FileSystem::Open(store.get(), options));
  }
  auto reply = RunAdmin(store.get(), fs.get(), request, progress);
  fs.reset();
  return reply;
}

}  // namespace ckptfs::cli
