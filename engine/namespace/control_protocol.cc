#include "engine/namespace/control_protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {

Status SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "send on the control socket");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// Returns false on EOF before the first byte.
Result<bool> RecvAll(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "recv on the control socket");
    }
    if (r == 0) {
      if (got == 0) return false;
      return Status::IOError("the control connection closed in the middle of a message");
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

Status SendFrame(int fd, std::string_view message) {
  if (message.size() > kMaxControlFrameBytes) {
    return Status::InvalidArgument("control message of " + std::to_string(message.size()) +
                                   " bytes is too large");
  }
  std::byte len[4];
  PutLE<uint32_t>(len, static_cast<uint32_t>(message.size()));
  CKPTFS_RETURN_IF_ERROR(SendAll(fd, reinterpret_cast<const char*>(len), 4));
  return SendAll(fd, message.data(), message.size());
}

Result<std::optional<std::string>> RecvFrame(int fd) {
  std::byte len[4];
  CKPTFS_ASSIGN_OR_RETURN(bool any, RecvAll(fd, reinterpret_cast<char*>(len), 4));
  if (!any) return std::optional<std::string>();
  uint32_t n = GetLE<uint32_t>(len);
  if (n > kMaxControlFrameBytes) {
    return Status::Corruption("control message announces " + std::to_string(n) + " bytes");
  }
  std::string msg(n, '\0');
  if (n > 0) {
    CKPTFS_ASSIGN_OR_RETURN(bool body, RecvAll(fd, msg.data(), n));
    if (!body) return Status::IOError("the control connection closed in the middle of a message");
  }
  return std::optional<std::string>(std::move(msg));
}

}  // namespace ckptfs
