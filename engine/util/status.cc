#include "engine/util/status.h"

#include <cerrno>
#include <cstring>

namespace ckptfs {

Status Status::FromErrno(int err, std::string_view what) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  Status s;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      s = NoSpace(msg + " (free disk space, or run `ckptfs gc`)");
      break;
    case ENOENT: s = NotFound(msg); break;
    case EEXIST: s = AlreadyExists(msg); break;
    case EINVAL: s = InvalidArgument(msg); break;
    case EROFS: s = ReadOnly(msg); break;
    case EBUSY:
    case EWOULDBLOCK: s = Busy(msg); break;
    case EOPNOTSUPP: s = NotSupported(msg); break;
    default: s = IOError(msg); break;
  }
  s.errno_ = err;
  return s;
}

int Status::ToErrno() const {
  if (errno_ != 0) return errno_;
  switch (code_) {
    case Code::kOk:
      return 0;
    case Code::kNotFound:
      return ENOENT;
    case Code::kCorruption:
      return EIO;
    case Code::kIOError:
      return EIO;
    case Code::kNoSpace:
      return ENOSPC;
    case Code::kInvalidArgument:
      return EINVAL;
    case Code::kAlreadyExists:
      return EEXIST;
    case Code::kBusy:
      return EBUSY;
    case Code::kNotSupported:
      return EOPNOTSUPP;
    case Code::kReadOnly:
      return EROFS;
  }
  return EIO;
}

std::string Status::ToString() const {
  const char* name = "Unknown";
  switch (code_) {
    case Code::kOk:
      return "OK";
    case Code::kNotFound:
      name = "Not found";
      break;
    case Code::kCorruption:
      name = "Corruption";
      break;
    case Code::kIOError:
      name = "I/O error";
      break;
    case Code::kNoSpace:
      name = "No space";
      break;
    case Code::kInvalidArgument:
      name = "Invalid argument";
      break;
    case Code::kAlreadyExists:
      name = "Already exists";
      break;
    case Code::kBusy:
      name = "Busy";
      break;
    case Code::kNotSupported:
      name = "Not supported";
      break;
    case Code::kReadOnly:
      name = "Read-only";
      break;
  }
  return std::string(name) + ": " + msg_;
}

}  // namespace ckptfs
