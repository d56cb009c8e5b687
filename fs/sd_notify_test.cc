#include "fs/sd_notify.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace ckptfs {
namespace {

// A datagram socket standing in for systemd's notification socket.
class FakeServiceManager {
 public:
  explicit FakeServiceManager(const std::string& name) : name_(name) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    if (name[0] == '@') addr.sun_path[0] = '\0';
    if (name[0] == '/') ::unlink(name.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr),
                     static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())),
              0)
        << std::strerror(errno);
    ::setenv("NOTIFY_SOCKET", name.c_str(), 1);
  }
  ~FakeServiceManager() {
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd_);
    if (name_[0] == '/') ::unlink(name_.c_str());
  }
  std::string Receive() {
    char buf[256];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    return n < 0 ? "(nothing)" : std::string(buf, static_cast<size_t>(n));
  }

 private:
  std::string name_;
  int fd_;
};

TEST(NotifyServiceManager, SendsOneDatagramToAPathSocket) {
  FakeServiceManager manager("/tmp/ckptfs-sd-notify-test-" + std::to_string(::getpid()));
  ASSERT_TRUE(NotifyServiceManager("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(manager.Receive(), "READY=1\nSTATUS=serving");
  ASSERT_TRUE(NotifyServiceManager("STOPPING=1").ok());
  EXPECT_EQ(manager.Receive(), "STOPPING=1");
}

TEST(NotifyServiceManager, SendsToAnAbstractSocket) {
  FakeServiceManager manager("@ckptfs-sd-notify-test-" + std::to_string(::getpid()));
  ASSERT_TRUE(NotifyServiceManager("READY=1").ok());
  EXPECT_EQ(manager.Receive(), "READY=1");
}

TEST(NotifyServiceManager, DoesNothingOutsideSystemdAndFailsOnAMissingSocket) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(NotifyServiceManager("READY=1").ok());
  ::setenv("NOTIFY_SOCKET", "/nonexistent/ckptfs-notify", 1);
  EXPECT_FALSE(NotifyServiceManager("READY=1").ok());
  ::setenv("NOTIFY_SOCKET", "relative", 1);
  EXPECT_FALSE(NotifyServiceManager("READY=1").ok());
  ::unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace ckptfs
