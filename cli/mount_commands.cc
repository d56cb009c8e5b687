// mount, umount, sync, seal (cli/mount_commands.h).
#include "cli/mount_commands.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/store/store.h"

namespace ckptfs::cli {
namespace {

Status SetControl(const std::string& path, const char* name) {
  if (::setxattr(path.c_str(), name, "1", 1, 0) != 0) {
    return Status::FromErrno(errno, std::string(name + 12) + " " + path);
  }
  return Status::OK();
}

// True while `pid` runs. A zombie has finished: the daemon is reparented to init, which may
// reap it late (or, in some containers, never).
bool Running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

Status NotAMount(const std::string& path) {
  return Status::InvalidArgument(path + " is not inside a ckptfs mount");
}

}  // namespace

int Mount(MountArgs args) {
  std::error_code ec;
  if (!args.create && args.s3_location.empty() &&
      !std::filesystem::exists(std::filesystem::path(args.store) / "ckptfs.json", ec)) {
    return Fail(Status::NotFound("no ckptfs store at " + args.store),
                "create one with `ckptfs init " + args.store + "`, or mount with --create");
  }
  if (auto m = MountAt(args.mountpoint)) {
    std::string what = m->fstype == "fuse.ckptfs" ? "the ckptfs store " + m->store : m->fstype;
    return Fail(
        Status::Busy(args.mountpoint + " is a mount point already (" + what + ")"),
        "unmount it first (`ckptfs umount " + args.mountpoint + "`), or choose another directory");
  }
  args.store = std::filesystem::absolute(args.store, ec).lexically_normal().string();
  if (!args.store.empty() && args.store.size() > 1 && args.store.back() == '/') {
    args.store.pop_back();
  }
  return RunMount(args);
}

// Makes everything durable, unmounts, and waits for the daemon to finish.
int Umount(const std::string& mountpoint) {
  auto mount = CkptfsMountHolding(mountpoint);
  if (!mount || mount->mountpoint != RealPath(mountpoint)) {
    return Fail(Status::InvalidArgument(mountpoint + " is not a ckptfs mount point"),
                mount ? "its mount point is " + mount->mountpoint : "see `ckptfs status`");
  }
  char pid_buf[32] = {0};
  ssize_t n = ::getxattr(mountpoint.c_str(), "user.ckptfs.pid", pid_buf, sizeof(pid_buf) - 1);
  if (n <= 0) return Fail(Status::FromErrno(errno, "ask the daemon of " + mountpoint));
  pid_t pid = static_cast<pid_t>(std::stol(std::string(pid_buf, static_cast<size_t>(n))));
  // A read-only mount has nothing to make durable, and refuses the sync attribute (EROFS).
  if (!mount->read_only) {
    if (Status s = SetControl(mountpoint, "user.ckptfs.sync"); !s.ok()) return Fail(s);
  }
  pid_t child = ::fork();
  if (child < 0) return Fail(Status::FromErrno(errno, "fork for fusermount3"));
  if (child == 0) {
    ::execlp("fusermount3", "fusermount3", "-u", mountpoint.c_str(), nullptr);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return Fail(Status::FromErrno(errno, "wait for fusermount3"));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return Fail(Status::NotFound("cannot run fusermount3"), "install the fuse3 package");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Fail(Status::Busy("fusermount3 -u " + mountpoint + " failed"),
                "files may still be open there (`fuser -m " + mountpoint + "`)");
  }
  for (int i = 0; Running(pid); ++i) {
    if (i == 100) std::fprintf(stderr, "ckptfs: waiting for the daemon (pid %d) to finish\n", pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return kExitOk;
}

int Sync(const std::string& mountpoint) {
  auto mount = CkptfsMountHolding(mountpoint);
  if (!mount) return Fail(NotAMount(mountpoint), "see `ckptfs status` for the mounts");
  if (mount->read_only) return kExitOk;  // nothing written, nothing to make durable
  Status s = SetControl(mountpoint, "user.ckptfs.sync");
  return s.ok() ? kExitOk : Fail(s);
}

int Seal(const std::string& version) {
  auto mount = CkptfsMountHolding(version);
  if (!mount) return Fail(NotAMount(version), "see `ckptfs status` for the mounts");
  // A version is a directory directly under the mount's root, or a file version (a checkpoint
  // file in a directory marked with user.ckptfs.file_versions; the daemon checks which).
  std::filesystem::path p(version);
  if (p.filename().empty()) p = p.parent_path();
  std::string parent = RealPath(p.parent_path().empty() ? "." : p.parent_path().string());
  struct stat st = {};
  const bool found = ::lstat(version.c_str(), &st) == 0;
  const bool is_dir = found && S_ISDIR(st.st_mode);
  const bool is_file = found && S_ISREG(st.st_mode);
  if (!is_file && (!is_dir || parent != mount->mountpoint)) {
    return Fail(Status::InvalidArgument(version + " is not a version"),
                "a version is a directory directly under the mount point (" + mount->mountpoint +
                    "/NAME)" + (S_ISLNK(st.st_mode) ? "; this is a symbolic link" : ""));
  }
  if (mount->read_only) {
    return Fail(Status::ReadOnly("the mount at " + mount->mountpoint + " is read-only"));
  }
  Status s = SetControl(version, "user.ckptfs.seal");
  if (!s.ok() && is_file && s.code() == Status::Code::kInvalidArgument) {
    return Fail(Status::InvalidArgument(version + " is not a version"),
                "a file is a version only in a directory marked for file versions "
                "(setfattr -n user.ckptfs.file_versions -v 1 DIR; docs/fs.md)");
  }
  if (!s.ok() && s.code() == Status::Code::kBusy) {
    return Fail(s, "a file of " + version +
                       " is open for writing through FUSE passthrough (the kernel writes it "
                       "directly, so its writes cannot be refused after a seal): seal once it "
                       "is closed");
  }
  return s.ok() ? kExitOk : Fail(s);
}

int FileVersions(const std::string& dir, bool on) {
  auto mount = CkptfsMountHolding(dir);
  if (!mount) return Fail(NotAMount(dir), "see `ckptfs status` for the mounts");
  struct stat st = {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Fail(Status::InvalidArgument(dir + " is not a directory"),
                "file versions are marked on the directory the checkpoint files go into");
  }
  if (mount->read_only) {
    return Fail(Status::ReadOnly("the mount at " + mount->mountpoint + " is read-only"));
  }
  const char* value = on ? "1" : "0";
  if (::setxattr(dir.c_str(), "user.ckptfs.file_versions", value, 1, 0) != 0) {
    return Fail(Status::FromErrno(errno, "file-versions " + dir));
  }
  std::printf("%s: checkpoint files %s\n", dir.c_str(),
              on ? "are versions of their own from now on (and those already there)"
                 : "are ordinary files again (sealed ones stay sealed)");
  return kExitOk;
}

}  // namespace ckptfs::cli
