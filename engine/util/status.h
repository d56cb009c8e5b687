// engine/util/status.h
//
// Errors are values. A Status is OK or carries a code and a message that says what happened
// (and, where it helps, what to do). Result<T> holds either a T or a non-OK Status.
//
//   Result<ContentId> id = writer->Finish();
//   if (!id.ok()) return id.status();
//   Use(*id);
//
// ToErrno() maps a Status onto the errno a filesystem should return for it.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ckptfs {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kNotFound,
    kCorruption,  // stored bytes fail a checksum or do not parse
    kIOError,     // the operating system failed an I/O call
    kNoSpace,     // the disk is full (ENOSPC, EDQUOT)
    kInvalidArgument,
    kAlreadyExists,
    kBusy,  // held by someone else (lock, open store)
    kNotSupported,
    kReadOnly,  // e.g. a sealed version
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status NotFound(std::string_view msg) { return Status(Code::kNotFound, msg); }
  static Status Corruption(std::string_view msg) { return Status(Code::kCorruption, msg); }
  static Status IOError(std::string_view msg) { return Status(Code::kIOError, msg); }
  static Status NoSpace(std::string_view msg) { return Status(Code::kNoSpace, msg); }
  static Status InvalidArgument(std::string_view msg) {
    return Status(Code::kInvalidArgument, msg);
  }
  static Status AlreadyExists(std::string_view msg) { return Status(Code::kAlreadyExists, msg); }
  static Status Busy(std::string_view msg) { return Status(Code::kBusy, msg); }
  static Status NotSupported(std::string_view msg) { return Status(Code::kNotSupported, msg); }
  static Status ReadOnly(std::string_view msg) { return Status(Code::kReadOnly, msg); }
  // Builds a Status from an errno value: ENOSPC/EDQUOT -> kNoSpace, ENOENT -> kNotFound, ...
  // `what` names the operation and object, e.g. "write pack /s/packs/000001.pack".
  // ToErrno() of the result returns `err` itself.
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsNoSpace() const { return code_ == Code::kNoSpace; }
  bool IsNotSupported() const { return code_ == Code::kNotSupported; }

  // The errno a filesystem returns for this status (0 when OK).
  int ToErrno() const;
  // "Corruption: <message>", or "OK".
  std::string ToString() const;

 private:
  Status(Code code, std::string_view msg) : code_(code), msg_(msg) {}
  Code code_ = Code::kOk;
  int errno_ = 0;  // set by FromErrno
  std::string msg_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "Result built from an OK status has no value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace ckptfs

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define CKPTFS_RETURN_IF_ERROR(expr) \
  do {                               \
    ::ckptfs::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

#define CKPTFS_CONCAT_INNER(a, b) a##b
#define CKPTFS_CONCAT(a, b) CKPTFS_CONCAT_INNER(a, b)
// Declares `lhs` from a Result expression, or returns its status from the enclosing function.
#define CKPTFS_ASSIGN_OR_RETURN(lhs, expr) \
  CKPTFS_ASSIGN_OR_RETURN_IMPL(CKPTFS_CONCAT(_res_, __LINE__), lhs, expr)
#define CKPTFS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)
