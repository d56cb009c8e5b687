#include "engine/format/pickle_ops.h"

namespace ckptfs {

using enum pickle::Op;

PickleOpInfo PickleOpInfoOf(uint8_t op) {
  using F = PickleFamily;
  using A = PickleArg;
  switch (op) {
    case kProto:
      return {F::kControl, {A::kFixed, 1}};
    case kFrame:
      return {F::kControl, {A::kFixed, 8}};
    case kStop:
    case kMark:
    case kPop:
    case kPopMark:
    case kDup:
      return {F::kControl, {}};

    case kNone:
    case kNewTrue:
    case kNewFalse:
      return {F::kScalar, {}};
    case kBinInt1:
      return {F::kScalar, {A::kFixed, 1}};
    case kBinInt2:
      return {F::kScalar, {A::kFixed, 2}};
    case kBinInt:
      return {F::kScalar, {A::kFixed, 4}};
    case kBinFloat:
      return {F::kScalar, {A::kFixed, 8}};
    case kLong1:
      return {F::kScalar, {A::kCounted, 1}};
    case kLong4:
      return {F::kScalar, {A::kCounted, 4}};
    case kInt:
    case kLong:
    case kFloat:
      return {F::kScalar, {A::kLines, 1}};

    case kShortBinString:
    case kShortBinUnicode:
    case kShortBinBytes:
      return {F::kText, {A::kCounted, 1}};
    case kBinString:
    case kBinUnicode:
    case kBinBytes:
      return {F::kText, {A::kCounted, 4}};
    case kBinUnicode8:
    case kBinBytes8:
    case kByteArray8:
      return {F::kText, {A::kCounted, 8}};
    case kString:
    case kUnicode:
      return {F::kText, {A::kLines, 1}};
    case kNextBuffer:
    case kReadOnlyBuffer:
      return {F::kText, {}};

    case kEmptyTuple:
    case kTuple:
    case kTuple1:
    case kTuple2:
    case kTuple3:
    case kEmptyList:
    case kList:
    case kAppend:
    case kAppends:
    case kEmptyDict:
    case kDict:
    case kSetItem:
    case kSetItems:
    case kEmptySet:
    case kAddItems:
    case kFrozenSet:
      return {F::kContainer, {}};

    case kGlobal:
    case kInst:
      return {F::kCall, {A::kLines, 2}};
    case kPersId:
      return {F::kCall, {A::kLines, 1}};
    case kExt1:
      return {F::kCall, {A::kFixed, 1}};
    case kExt2:
      return {F::kCall, {A::kFixed, 2}};
    case kExt4:
      return {F::kCall, {A::kFixed, 4}};
    case kStackGlobal:
    case kReduce:
    case kBuild:
    case kNewObj:
    case kNewObjEx:
    case kObj:
    case kBinPersId:
      return {F::kCall, {}};

    case kPut:
    case kGet:
      return {F::kMemo, {A::kLines, 1}};
    case kBinPut:
    case kBinGet:
      return {F::kMemo, {A::kFixed, 1}};
    case kLongBinPut:
    case kLongBinGet:
      return {F::kMemo, {A::kFixed, 4}};
    case kMemoize:
      return {F::kMemo, {}};

    default:
      return {};
  }
}

Result<size_t> PickleOpLength(std::string_view pkl, size_t at) {
  if (at >= pkl.size()) return Status::Corruption("pickle: truncated");
  const PickleOpInfo info = PickleOpInfoOf(static_cast<uint8_t>(pkl[at]));
  if (info.family == PickleFamily::kUnknown) return Status::Corruption("pickle: unknown opcode");
  const size_t left = pkl.size() - at - 1;
  switch (info.arg.kind) {
    case PickleArg::kNone:
      return 1;
    case PickleArg::kFixed:
      if (info.arg.n > left) return Status::Corruption("pickle: truncated");
      return 1 + size_t{info.arg.n};
    case PickleArg::kCounted: {
      if (info.arg.n > left) return Status::Corruption("pickle: truncated");
      uint64_t n = 0;
      for (size_t i = 0; i < info.arg.n; ++i) {
        n |= uint64_t{static_cast<uint8_t>(pkl[at + 1 + i])} << (8 * i);
      }
      if (n > left - info.arg.n) return Status::Corruption("pickle: truncated");
      return 1 + size_t{info.arg.n} + static_cast<size_t>(n);
    }
    case PickleArg::kLines: {
      size_t q = at + 1;
      for (int i = 0; i < info.arg.n; ++i) {
        q = pkl.find('\n', q);
        if (q == std::string_view::npos) return Status::Corruption("pickle: truncated");
        ++q;
      }
      return q - at;
    }
  }
  return Status::Corruption("pickle: unknown opcode");
}

}  // namespace ckptfs
