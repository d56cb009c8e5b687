// Which mount serves a path or a store, from /proc/self/mountinfo (cli/cli.h).
#include <limits.h>
#include <stdlib.h>
#include <sys/xattr.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli.h"

namespace ckptfs::cli {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool octal = true;
      for (size_t k = 1; k <= 3; ++k) {
        if (s[i + k] < '0' || s[i + k] > '7') {
          octal = false;
          break;
        }
        v = v * 8 + (s[i + k] - '0');
      }
      if (octal) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool HasOption(const std::string& list, const std::string& option) {
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == option) return true;
  }
  return false;
}

}  // namespace

std::string DaemonPath(const std::string& mountpoint, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  // A daemon started with a relative STORE (by an older ckptfs) names paths relative to its
  // working directory.
  char pid[32] = {0};
  ssize_t n = ::getxattr(mountpoint.c_str(), "user.ckptfs.pid", pid, sizeof(pid) - 1);
  if (n <= 0) return path;
  std::error_code ec;
  auto cwd = std::filesystem::read_symlink(
      "/proc/" + std::string(pid, static_cast<size_t>(n)) + "/cwd", ec);
  return ec ? path : (cwd / path).lexically_normal().string();
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

std::vector<MountEntry> AllMounts() {
  std::vector<MountEntry> mounts;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream left(line.substr(0, dash)), right(line.substr(dash + 3));
    std::string id, parent, dev, root, point, options;
    if (!(left >> id >> parent >> dev >> root >> point >> options)) continue;
    MountEntry m;
    m.mountpoint = Unescape(point);
    m.read_only = HasOption(options, "ro");
    if (!(right >> m.fstype >> m.source)) continue;
    m.source = Unescape(m.source);
    if (m.fstype == "fuse.ckptfs" && m.source.rfind("ckptfs:", 0) == 0) {
      m.store = DaemonPath(m.mountpoint, m.source.substr(7));
    }
    mounts.push_back(std::move(m));
  }
  return mounts;
}

std::vector<MountEntry> CkptfsMounts() {
  std::vector<MountEntry> out;
  for (auto& m : AllMounts()) {
    if (m.fstype == "fuse.ckptfs") out.push_back(std::move(m));
  }
  return out;
}

std::optional<MountEntry> CkptfsMountHolding(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  // The parent's real path for the last component: a symlink at the mount's top (MNT/latest)
  // is held by the mount even when it points elsewhere.
  std::filesystem::path p(path);
  std::string real =
      p.has_parent_path() && p.filename() != ".." && p.filename() != "."
          ? (std::filesystem::path(RealPath(p.parent_path().string())) / p.filename()).string()
          : RealPath(path);
  if (std::filesystem::is_directory(path, ec) && !std::filesystem::is_symlink(path, ec)) {
    real = RealPath(path);
  }
  std::optional<MountEntry> best;
  for (auto& m : AllMounts()) {  // later entries are mounted over earlier ones
    const std::string& mp = m.mountpoint;
    bool holds =
        real == mp || mp == "/" ||
        (real.size() > mp.size() && real.compare(0, mp.size(), mp) == 0 && real[mp.size()] == '/');
    if (holds && (!best || mp.size() >= best->mountpoint.size())) best = m;
  }
  if (best && best->fstype == "fuse.ckptfs") return best;
  return std::nullopt;
}

std::optional<MountEntry> MountAt(const std::string& path) {
  std::string real = RealPath(path);
  std::optional<MountEntry> found;
  for (auto& m : AllMounts()) {
    if (m.mountpoint == real) found = m;
  }
  return found;
}

std::optional<MountEntry> MountOfStore(const std::string& store) {
  std::string real = RealPath(store);
  for (auto& m : CkptfsMounts()) {
    if (!m.store.empty() && RealPath(m.store) == real) return m;
  }
  return std::nullopt;
}

Result<Target> ResolveTarget(const std::string& path) {
  if (auto m = CkptfsMountHolding(path)) return Target{m->store, m};
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(path) / "ckptfs.json", ec)) {
    return Target{path, MountOfStore(path)};
  }
  return Status::NotFound(path + " is neither a ckptfs store nor inside a ckptfs mount");
}

}  // namespace ckptfs::cli
