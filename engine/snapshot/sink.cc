#include "engine/snapshot/sink.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/namespace/control_protocol.h"
#include "engine/store/record.h"
#include "engine/util/file.h"

namespace ckptfs::snapshot {
namespace {

using nlohmann::json;

// The reply's error as a Status, or OK for {"ok": true, ...}.
Status ReplyStatus(const json& reply) {
  if (reply.is_object() && reply.contains("ok") && reply["ok"].is_boolean() &&
      reply["ok"].get<bool>()) {
    return Status::OK();
  }
  std::string error = "malformed reply from the ckptfs daemon";
  if (reply.is_object() && reply.contains("error") && reply["error"].is_string()) {
    error = reply["error"].get<std::string>();
  }
  return Status::IOError("ckptfs daemon: " + error);
}

class DaemonSink : public PersistSink {
 public:
  explicit DaemonSink(FileDescriptor fd) : fd_(std::move(fd)) {}

  Status Begin(const std::string& version, int rank, int world_size) override {
    ControlRequest req;
    req.op = ControlRequest::Op::kBegin;
    req.version = version;
    req.rank = static_cast<uint32_t>(rank);
    req.world_size = static_cast<uint32_t>(world_size);
    CKPTFS_ASSIGN_OR_RETURN(json reply, Call(EncodeControlRequest(req)));
    max_delta_chain_ = 1;  // a daemon that does not say takes no deltas
    if (reply.contains("max_delta_chain") && reply["max_delta_chain"].is_number_unsigned()) {
      max_delta_chain_ = std::max<uint32_t>(1, reply["max_delta_chain"].get<uint32_t>());
    }
    return Status::OK();
  }

  Result<PackTarget> ReservePack() override {
    CKPTFS_ASSIGN_OR_RETURN(json reply, Call(EncodeControlRequest(ControlRequest{})));
    if (!reply.contains("pack_id") || !reply["pack_id"].is_number_unsigned() ||
        !reply.contains("path") || !reply["path"].is_string()) {
      return Status::IOError("ckptfs daemon: malformed reserve_pack reply");
    }
    return PackTarget{reply["pack_id"].get<uint32_t>(), reply["path"].get<std::string>()};
  }

  Status Commit(const RankCommit& commit) override {
    CKPTFS_RETURN_IF_ERROR(SendFrame(fd_.get(), EncodeCommit(commit)));
    return Receive().status();  // {"ok": true, "state": "accepted"}
  }

  Status WaitComplete() override { return Receive().status(); }
  uint32_t max_delta_chain() const override { return max_delta_chain_; }

 private:
  Result<json> Call(const std::string& request) {
    CKPTFS_RETURN_IF_ERROR(SendFrame(fd_.get(), request));
    return Receive();
  }
  Result<json> Receive() {
    CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> frame, RecvFrame(fd_.get()));
    if (!frame) return Status::IOError("the ckptfs daemon closed the control connection");
    json reply = json::parse(*frame, nullptr, /*allow_exceptions=*/false);
    CKPTFS_RETURN_IF_ERROR(ReplyStatus(reply));
    return reply;
  }

  FileDescriptor fd_;
  uint32_t max_delta_chain_ = 1;
};

// The directory sink has no store to bound chains: the store's default.
constexpr uint32_t kDirSinkMaxDeltaChain = 8;

class DirSink : public PersistSink {
 public:
  explicit DirSink(std::filesystem::path dir) : dir_(std::move(dir)) {}

  Status Begin(const std::string& version, int rank, int) override {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) return Status::IOError("create " + dir_.string() + ": " + ec.message());
    version_ = version;
    rank_ = rank;
    return Status::OK();
  }

  Result<PackTarget> ReservePack() override {
    for (;;) {
      uint32_t id = ++next_id_;
      auto path = dir_ / PackFileName(id);
      auto fd = OpenFile(path, O_WRONLY | O_CREAT | O_EXCL);
      if (!fd.ok()) {
        if (std::filesystem::exists(path)) continue;  // another process's pack
        return fd.status();
      }
      std::byte header[kPackHeaderBytes];
      EncodePackHeader(id, header);
      CKPTFS_RETURN_IF_ERROR(PWriteFull(fd->get(), 0, {header, kPackHeaderBytes}, path));
      return PackTarget{id, path};
    }
  }

  Status Commit(const RankCommit& commit) override {
    return WriteFileAtomic(
        dir_ / ("commit-" + version_ + "-rank" + std::to_string(rank_) + ".json"),
        EncodeCommit(commit));
  }

  Status WaitComplete() override { return Status::OK(); }
  uint32_t max_delta_chain() const override { return kDirSinkMaxDeltaChain; }

 private:
  const std::filesystem::path dir_;
  std::string version_;
  int rank_ = 0;
  uint32_t next_id_ = 0;
};

}  // namespace

Result<std::unique_ptr<PersistSink>> ConnectDaemon(const std::filesystem::path& socket) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.string().size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("control socket path too long: " + socket.string());
  }
  std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
  FileDescriptor fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno(
        errno, "connect to the ckptfs daemon at " + socket.string() + " (is the store mounted?)");
  }
  return std::unique_ptr<PersistSink>(new DaemonSink(std::move(fd)));
}

std::unique_ptr<PersistSink> NewDirSink(const std::filesystem::path& dir) {
  return std::make_unique<DirSink>(dir);
}

}  // namespace ckptfs::snapshot
