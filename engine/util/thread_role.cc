#include "engine/util/thread_role.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ckptfs {
namespace {

constexpr std::string_view kPrefix = "ckptfs-";
constexpr std::string_view kIoUringPrefix = "iou-";  // iou-wrk-TID, iou-sqp-TID

// utime + stime (fields 14 and 15 of /proc/.../stat) in seconds; -1 if unreadable.
double ThreadCpuSeconds(const std::filesystem::path& task) {
  std::ifstream in(task / "stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  const size_t paren = line.rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos) return -1;
  std::istringstream fields(line.substr(paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace

void SetThreadRole(std::string_view role) {
  std::string name(kPrefix);
  name += role.substr(0, 15 - kPrefix.size());
  (void)::pthread_setname_np(::pthread_self(), name.c_str());
}

std::map<std::string, double> CpuByRole() {
  std::map<std::string, double> out;
  std::error_code ec;
  double live = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    const double seconds = ThreadCpuSeconds(task.path());
    if (seconds < 0) continue;  // the thread exited meanwhile
    const std::string role = name.starts_with(kPrefix)          ? name.substr(kPrefix.size())
                             : name.starts_with(kIoUringPrefix) ? std::string(kIoUringRole)
                                                                : std::string(kUnnamedRole);
    out[role] += seconds;
    live += seconds;
  }
  if (ec) return {};
  rusage self{};
  if (::getrusage(RUSAGE_SELF, &self) == 0) {
    auto secs = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
    };
    const double total = secs(self.ru_utime) + secs(self.ru_stime);
    // Clock ticks against microseconds: never report a negative remainder.
    out[std::string(kExitedRole)] = total > live ? total - live : 0.0;
  }
  return out;
}

}  // namespace ckptfs
