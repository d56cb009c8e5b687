#include "engine/format/torch_pickle.h"

#include <bit>
#include <charconv>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/format/pickle_ops.h"
#include "engine/util/coding.h"

namespace ckptfs {
namespace {

using NodeId = uint32_t;

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,     // fits int64
  kBigInt,  // does not; its value is not kept
  kFloat,
  kString,
  kBytes,
  kTuple,
  kList,
  kDict,
  kGlobal,
  kStorage,  // a persistent id that names a storage
  kTensor,
  kOpaque,  // anything not understood
};

// What an allow-listed global is.
enum class Callable : uint8_t {
  kOther,
  kRebuildTensor,  // torch._utils._rebuild_tensor(storage, offset, size, stride)
  kRebuildTensorV2,
  kRebuildParameter,           // (data, requires_grad, hooks)
  kRebuildParameterWithState,  // (data, requires_grad, hooks, state)
  kRebuildFromTypeV2,          // (func, new_type, args, state)
  kOrderedDict,
  kStorageType,  // torch.FloatStorage, ...: `dtype` says which
  kDType,        // torch.float32, ...
};

// Longer str and bytes dict keys are not deduplicated, storage keys and locations are refused,
// and globals are not listed: work per opcode stays bounded however often a memoized string
// is used.
constexpr size_t kMaxKeyBytes = 256;

// A dict key as Python hashes and compares it, for the kinds of keys that are deduplicated:
// equal numbers are one key (True == 1 == 1.0). Views of the input, never copies.
struct DictKey {
  char tag = 0;  // 'n' None, 'i' int (bool, integral float), 'f' other float, 's', 'b', 'g'
  int64_t i = 0;
  std::string_view a, b;
  bool operator==(const DictKey&) const = default;
};
struct DictKeyHash {
  size_t operator()(const DictKey& k) const {
    const std::hash<std::string_view> h;
    return (static_cast<size_t>(k.tag) * 0x9e3779b97f4a7c15ULL) ^ std::hash<int64_t>()(k.i) ^
           h(k.a) ^ (h(k.b) << 1);
  }
};
using DictKeys = std::unordered_map<DictKey, uint32_t, DictKeyHash>;

struct Node {
  Kind kind = Kind::kNone;
  Callable callable = Callable::kOther;  // kGlobal
  DType dtype = DType::kU8;              // kGlobal kStorageType and kDType
  union {
    int64_t i = 0;  // kBool, kInt; kStorage, kTensor: index into storages / tensors
    double f;       // kFloat
  };
  std::string_view text;           // kString, kBytes (views of the input); kGlobal: module
  std::string_view name;           // kGlobal
  std::vector<NodeId> items;       // kTuple, kList; kDict: key, value, key, value, ...
  std::unique_ptr<DictKeys> keys;  // kDict: item index of each hashed key, made on first use
};

struct TensorMeta {
  size_t storage = 0;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t numel = 1;
};

struct StorageName {
  std::string_view module;
  std::string_view name;
  DType dtype;
};

constexpr StorageName kStorageTypes[] = {
    {"torch", "DoubleStorage", DType::kF64},
    {"torch", "FloatStorage", DType::kF32},
    {"torch", "HalfStorage", DType::kF16},
    {"torch", "BFloat16Storage", DType::kBF16},
    {"torch", "LongStorage", DType::kI64},
    {"torch", "IntStorage", DType::kI32},
    {"torch", "ShortStorage", DType::kI16},
    {"torch", "CharStorage", DType::kI8},
    {"torch", "ByteStorage", DType::kU8},
    {"torch", "BoolStorage", DType::kBool},
    {"torch", "ComplexFloatStorage", DType::kC64},
    {"torch", "ComplexDoubleStorage", DType::kC128},
    // Newer torch (2.1+, 2.3+) names the storages of its newer dtypes so.
    {"torch", "Float8_e4m3fnStorage", DType::kF8E4M3},
    {"torch", "Float8_e5m2Storage", DType::kF8E5M2},
    {"torch", "UInt16Storage", DType::kU16},
    {"torch", "UInt32Storage", DType::kU32},
    {"torch", "UInt64Storage", DType::kU64},
    // torch.load reads an untyped storage's numel as bytes.
    {"torch", "UntypedStorage", DType::kU8},
    {"torch.storage", "UntypedStorage", DType::kU8},
    {"torch", "_UntypedStorage", DType::kU8},
    {"torch.storage", "_UntypedStorage", DType::kU8},
};

struct CallableName {
  std::string_view module;
  std::string_view name;
  Callable callable;
};

constexpr CallableName kCallables[] = {
    {"torch._utils", "_rebuild_tensor", Callable::kRebuildTensor},
    {"torch._utils", "_rebuild_tensor_v2", Callable::kRebuildTensorV2},
    {"torch._utils", "_rebuild_parameter", Callable::kRebuildParameter},
    {"torch._utils", "_rebuild_parameter_with_state", Callable::kRebuildParameterWithState},
    {"torch._tensor", "_rebuild_from_type_v2", Callable::kRebuildFromTypeV2},
    {"collections", "OrderedDict", Callable::kOrderedDict},
};

using enum pickle::Op;

constexpr int kHighestProtocol = 5;

// UTF-8 as CPython decodes pickled str ("surrogatepass": encoded surrogates are accepted).
bool IsUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return false;
    i += len;
  }
  return true;
}

// "module.name" (appended one by one: GCC 12 -O3 warns wrongly about "x" + std::string).
std::string DottedName(std::string_view module, std::string_view name) {
  std::string s(module);
  s.append(1, '.').append(name);
  return s;
}

// A float as Python's repr() writes it, near enough for a dict key: "1.5", "1.0", "1e+20".
std::string FloatKey(double f) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s == "inf" || s == "-inf" || s == "nan" || s == "-nan") return s;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

class Unpickler {
 public:
  Unpickler(Bytes pkl, const TorchPickleLimits& limits) : in_(AsChars(pkl)), limits_(limits) {}

  Result<TorchPickleIndex> Run();

 private:
  // Reading the input.
  Result<std::string_view> Read(size_t n);
  Result<std::string_view> ReadLine();
  template <typename T>
  Result<T> ReadLE();
  Result<size_t> ReadLength(size_t width);

  // The value stack, its marks and the memo.
  Result<NodeId> NewNode(Kind kind);
  Status Push(NodeId id);
  Result<NodeId> Pop();
  Result<NodeId> Top();
  Result<size_t> PopMark();  // the stack's size at the mark
  // REQUIRES: `from` was returned by PopMark(). The entry below the mark's.
  Result<NodeId> BelowMark(size_t from);
  Status PushNew(Kind kind);
  Status PushInt(int64_t v);
  Status PushText(Kind kind, std::string_view text);
  Status PushSequence(Kind kind, size_t from);
  Status PushOpaque() { return PushNew(Kind::kOpaque); }
  Status Put(uint64_t index);
  Status Get(uint64_t index);

  // Opcodes: Step dispatches by family to one of the Step* below.
  Status Step(uint8_t op, bool* stop);
  Status StepControl(uint8_t op, bool* stop);
  Status StepScalar(uint8_t op);
  Status StepText(uint8_t op);
  Status StepContainer(uint8_t op);
  Status StepCall(uint8_t op);
  Status StepMemo(uint8_t op);
  Status Unsupported(uint8_t op) const;
  Status LoadTextInt(bool is_long);
  Status LoadLong(size_t width);
  Status LoadString(Kind kind, size_t width, bool signed_length = false);
  Status LoadGlobal(std::string_view module, std::string_view name);
  Status LoadStackGlobal();
  Status LoadReduce();
  Status LoadNewObj(bool ex);
  Status LoadBinPersId();
  Status LoadDict(size_t from, NodeId dict);
  Status LoadAppends(size_t from, NodeId list);
  Status SetItem(NodeId dict, NodeId key, NodeId value);

  // Calls of allow-listed globals.
  Result<NodeId> Call(NodeId callable, NodeId args);
  Result<NodeId> RebuildTensor(const std::vector<NodeId>& args);
  Result<NodeId> MakeOrderedDict(const std::vector<NodeId>& args);
  Result<std::vector<int64_t>> IntTuple(NodeId id, const char* what);
  std::optional<DictKey> HashKey(NodeId id) const;
  Status CountCopies(size_t n);

  // The walk from the root.
  Status Walk(NodeId root);
  // index_.scalars from the root, when it is a dict.
  void CollectRootScalars(NodeId root);
  Status Emit(NodeId tensor, const std::string& path);
  void AppendKey(NodeId key, std::string* path) const;

  Node& node(NodeId id) { return nodes_[id]; }
  const Node& node(NodeId id) const { return nodes_[id]; }

  std::string_view in_;
  size_t pos_ = 0;
  const TorchPickleLimits& limits_;

  std::vector<Node> nodes_;
  std::vector<NodeId> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, NodeId> memo_;
  std::vector<TensorMeta> tensors_;
  std::unordered_map<std::string_view, size_t> storage_by_key_;  // views of index_.storages
  size_t copied_items_ = 0;  // by MakeOrderedDict and RebuildTensor, from other containers
  size_t index_bytes_ = 0;   // of the reported tensors
  size_t walk_bytes_ = 0;    // of keys appended to paths during the walk
  TorchPickleIndex index_;
};

Status Truncated() { return Status::Corruption("pickle: ends before its STOP opcode"); }
Status Underflow() { return Status::Corruption("pickle: stack underflow"); }
Status TooMany(const char* what, size_t limit) {
  return Status::InvalidArgument(std::string("pickle: more ") + what + " than the limit of " +
                                 std::to_string(limit));
}

Result<std::string_view> Unpickler::Read(size_t n) {
  if (in_.size() - pos_ < n) return Truncated();
  std::string_view s = in_.substr(pos_, n);
  pos_ += n;
  return s;
}

Result<std::string_view> Unpickler::ReadLine() {
  const size_t end = in_.find('\n', pos_);
  if (end == std::string_view::npos) return Truncated();
  std::string_view s = in_.substr(pos_, end - pos_);
  pos_ = end + 1;
  return s;
}

template <typename T>
Result<T> Unpickler::ReadLE() {
  CKPTFS_ASSIGN_OR_RETURN(std::string_view s, Read(sizeof(T)));
  return GetLE<T>(s.data());
}

// A length of `width` bytes (1, 4 or 8), unsigned.
Result<size_t> Unpickler::ReadLength(size_t width) {
  uint64_t n;
  if (width == 1) {
    CKPTFS_ASSIGN_OR_RETURN(n, ReadLE<uint8_t>());
  } else if (width == 4) {
    CKPTFS_ASSIGN_OR_RETURN(n, ReadLE<uint32_t>());
  } else {
    CKPTFS_ASSIGN_OR_RETURN(n, ReadLE<uint64_t>());
  }
  if (n > in_.size() - pos_) return Truncated();
  return static_cast<size_t>(n);
}

Result<NodeId> Unpickler::NewNode(Kind kind) {
  if (nodes_.size() >= limits_.max_objects) return TooMany("objects", limits_.max_objects);
  nodes_.emplace_back().kind = kind;
  return static_cast<NodeId>(nodes_.size() - 1);
}

Status Unpickler::Push(NodeId id) {
  if (stack_.size() >= limits_.max_objects) return TooMany("stack entries", limits_.max_objects);
  stack_.push_back(id);
  return Status::OK();
}

Result<NodeId> Unpickler::Pop() {
  if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Underflow();
  NodeId id = stack_.back();
  stack_.pop_back();
  return id;
}

Result<NodeId> Unpickler::Top() {
  if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Underflow();
  return stack_.back();
}

Result<size_t> Unpickler::PopMark() {
  if (marks_.empty()) return Status::Corruption("pickle: no MARK on the stack");
  size_t at = marks_.back();
  marks_.pop_back();
  return at;
}

Result<NodeId> Unpickler::BelowMark(size_t from) {
  if (from <= (marks_.empty() ? 0 : marks_.back())) return Underflow();
  return stack_[from - 1];
}

Status Unpickler::PushNew(Kind kind) {
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(kind));
  return Push(id);
}

Status Unpickler::PushInt(int64_t v) {
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kInt));
  node(id).i = v;
  return Push(id);
}

Status Unpickler::PushText(Kind kind, std::string_view text) {
  if (kind == Kind::kString && !IsUtf8(text)) {
    return Status::Corruption("pickle: a str is not UTF-8");
  }
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(kind));
  node(id).text = text;
  return Push(id);
}

// Moves the stack's entries from `from` on into a new tuple, list or dict.
Status Unpickler::PushSequence(Kind kind, size_t from) {
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(kind));
  if (kind == Kind::kDict) {
    CKPTFS_RETURN_IF_ERROR(LoadDict(from, id));
  } else {
    node(id).items.assign(stack_.begin() + from, stack_.end());
    stack_.resize(from);
  }
  return Push(id);
}

Status Unpickler::Put(uint64_t index) {
  CKPTFS_ASSIGN_OR_RETURN(NodeId top, Top());
  if (memo_.size() >= limits_.max_objects && !memo_.contains(index)) {
    return TooMany("memo entries", limits_.max_objects);
  }
  memo_[index] = top;
  return Status::OK();
}

Status Unpickler::Get(uint64_t index) {
  auto it = memo_.find(index);
  if (it == memo_.end()) {
    return Status::Corruption("pickle: memo entry " + std::to_string(index) + " is not set");
  }
  return Push(it->second);
}

Result<TorchPickleIndex> Unpickler::Run() {
  if (in_.size() > limits_.max_pickle_bytes) {
    return Status::InvalidArgument("pickle: " + std::to_string(in_.size()) +
                                   " bytes, over the limit of " +
                                   std::to_string(limits_.max_pickle_bytes));
  }
  nodes_.reserve(std::min(limits_.max_objects, in_.size() / 4 + 16));
  bool stop = false;
  while (!stop) {
    if (pos_ == in_.size()) return Truncated();
    const auto op = static_cast<uint8_t>(in_[pos_++]);
    CKPTFS_RETURN_IF_ERROR(Step(op, &stop));
  }
  CKPTFS_ASSIGN_OR_RETURN(NodeId root, Pop());
  CKPTFS_RETURN_IF_ERROR(Walk(root));
  CollectRootScalars(root);
  return std::move(index_);
}

void Unpickler::CollectRootScalars(NodeId root) {
  const Node& d = node(root);
  if (d.kind != Kind::kDict) return;
  for (size_t at = 0; at + 1 < d.items.size(); at += 2) {
    if (index_.scalars.size() >= TorchPickleIndex::kMaxScalars) return;
    const Node& k = node(d.items[at]);
    const Node& v = node(d.items[at + 1]);
    if (k.kind != Kind::kString || k.text.size() > TorchPickleIndex::kMaxScalarKeyBytes) continue;
    TorchScalar s;
    s.key = std::string(k.text);
    switch (v.kind) {
      case Kind::kInt:
        s.kind = TorchScalar::Kind::kInt;
        s.i = v.i;
        break;
      case Kind::kBool:
        s.kind = TorchScalar::Kind::kBool;
        s.i = v.i;
        break;
      case Kind::kFloat:
        s.kind = TorchScalar::Kind::kFloat;
        s.f = v.f;
        break;
      case Kind::kString:
        if (v.text.size() > TorchPickleIndex::kMaxScalarTextBytes) continue;
        s.kind = TorchScalar::Kind::kString;
        s.text = std::string(v.text);
        break;
      default:
        continue;
    }
    index_.scalars.push_back(std::move(s));
  }
}

Status Unpickler::Unsupported(uint8_t op) const {
  const char hex[] = {"0123456789abcdef"[op >> 4], "0123456789abcdef"[op & 15], '\0'};
  return Status::Corruption(std::string("pickle: unsupported opcode 0x") + hex + " at byte " +
                            std::to_string(pos_ - 1));
}

// One opcode, dispatched by its family (engine/format/pickle_ops.h). Opcodes a torch pickle
// never holds (STRING, UNICODE, out-of-band buffers) are refused as unsupported.
Status Unpickler::Step(uint8_t op, bool* stop) {
  switch (PickleOpInfoOf(op).family) {
    case PickleFamily::kControl:
      return StepControl(op, stop);
    case PickleFamily::kScalar:
      return StepScalar(op);
    case PickleFamily::kText:
      return StepText(op);
    case PickleFamily::kContainer:
      return StepContainer(op);
    case PickleFamily::kCall:
      return StepCall(op);
    case PickleFamily::kMemo:
      return StepMemo(op);
    case PickleFamily::kUnknown:
      break;
  }
  return Unsupported(op);
}

Status Unpickler::StepControl(uint8_t op, bool* stop) {
  switch (op) {
    case kProto: {
      CKPTFS_ASSIGN_OR_RETURN(uint8_t proto, ReadLE<uint8_t>());
      if (proto > kHighestProtocol) {
        return Status::Corruption("pickle: unsupported protocol " + std::to_string(proto));
      }
      return Status::OK();
    }
    case kFrame: {
      CKPTFS_ASSIGN_OR_RETURN(uint64_t n, ReadLE<uint64_t>());
      if (n > in_.size() - pos_) return Truncated();
      return Status::OK();  // frames only group opcodes
    }
    case kStop:
      *stop = true;
      return Status::OK();
    case kMark:
      if (marks_.size() >= limits_.max_objects) return TooMany("marks", limits_.max_objects);
      marks_.push_back(stack_.size());
      return Status::OK();
    case kPop:
      if (stack_.size() > (marks_.empty() ? 0 : marks_.back())) {
        stack_.pop_back();
        return Status::OK();
      }
      return PopMark().status();
    case kPopMark: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      stack_.resize(from);
      return Status::OK();
    }
    case kDup: {
      CKPTFS_ASSIGN_OR_RETURN(NodeId top, Top());
      return Push(top);
    }
    default:
      return Unsupported(op);
  }
}

Status Unpickler::StepScalar(uint8_t op) {
  switch (op) {
    case kNone:
      return PushNew(Kind::kNone);
    case kNewTrue:
    case kNewFalse: {
      CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kBool));
      node(id).i = op == kNewTrue;
      return Push(id);
    }
    case kInt:
      return LoadTextInt(false);
    case kLong:
      return LoadTextInt(true);
    case kBinInt: {
      CKPTFS_ASSIGN_OR_RETURN(int32_t v, ReadLE<int32_t>());
      return PushInt(v);
    }
    case kBinInt1: {
      CKPTFS_ASSIGN_OR_RETURN(uint8_t v, ReadLE<uint8_t>());
      return PushInt(v);
    }
    case kBinInt2: {
      CKPTFS_ASSIGN_OR_RETURN(uint16_t v, ReadLE<uint16_t>());
      return PushInt(v);
    }
    case kLong1:
      return LoadLong(1);
    case kLong4:
      return LoadLong(4);
    case kFloat: {
      CKPTFS_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      double f = 0;
      auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), f);
      if (ec != std::errc() || end != line.data() + line.size()) {
        return Status::Corruption("pickle: FLOAT is not a number");
      }
      CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kFloat));
      node(id).f = f;
      return Push(id);
    }
    case kBinFloat: {
      CKPTFS_ASSIGN_OR_RETURN(uint64_t bits, ReadLE<uint64_t>());
      CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kFloat));
      node(id).f = std::bit_cast<double>(__builtin_bswap64(bits));  // big-endian
      return Push(id);
    }
    default:
      return Unsupported(op);
  }
}

Status Unpickler::StepText(uint8_t op) {
  switch (op) {
    case kShortBinString:
      return LoadString(Kind::kString, 1);
    case kBinString:
      return LoadString(Kind::kString, 4, /*signed_length=*/true);
    case kShortBinUnicode:
      return LoadString(Kind::kString, 1);
    case kBinUnicode:
      return LoadString(Kind::kString, 4);
    case kBinUnicode8:
      return LoadString(Kind::kString, 8);
    case kShortBinBytes:
      return LoadString(Kind::kBytes, 1);
    case kBinBytes:
      return LoadString(Kind::kBytes, 4);
    case kBinBytes8:
    case kByteArray8:
      return LoadString(Kind::kBytes, 8);
    default:
      return Unsupported(op);
  }
}

Status Unpickler::StepContainer(uint8_t op) {
  switch (op) {
    case kEmptyTuple:
      return PushNew(Kind::kTuple);
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const size_t n = op - kTuple1 + 1;
      const size_t fence = marks_.empty() ? 0 : marks_.back();
      if (stack_.size() < fence + n) return Underflow();
      return PushSequence(Kind::kTuple, stack_.size() - n);
    }
    case kTuple: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      return PushSequence(Kind::kTuple, from);
    }
    case kEmptyList:
      return PushNew(Kind::kList);
    case kList: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      return PushSequence(Kind::kList, from);
    }
    case kAppend: {
      CKPTFS_ASSIGN_OR_RETURN(NodeId value, Pop());
      CKPTFS_ASSIGN_OR_RETURN(NodeId list, Top());
      stack_.push_back(value);
      return LoadAppends(stack_.size() - 1, list);
    }
    case kAppends: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      CKPTFS_ASSIGN_OR_RETURN(NodeId list, BelowMark(from));
      return LoadAppends(from, list);
    }
    case kEmptyDict:
      return PushNew(Kind::kDict);
    case kDict: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      return PushSequence(Kind::kDict, from);
    }
    case kSetItem: {
      const size_t fence = marks_.empty() ? 0 : marks_.back();
      if (stack_.size() < fence + 3) return Underflow();
      return LoadDict(stack_.size() - 2, stack_[stack_.size() - 3]);
    }
    case kSetItems: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      CKPTFS_ASSIGN_OR_RETURN(NodeId dict, BelowMark(from));
      return LoadDict(from, dict);
    }
    case kEmptySet:
      return PushOpaque();
    case kAddItems: {  // to a set: opaque
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      CKPTFS_RETURN_IF_ERROR(BelowMark(from).status());
      stack_.resize(from);
      return Status::OK();
    }
    case kFrozenSet: {
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      stack_.resize(from);
      return PushOpaque();
    }
    default:
      return Unsupported(op);
  }
}

Status Unpickler::StepCall(uint8_t op) {
  switch (op) {
    case kGlobal: {
      CKPTFS_ASSIGN_OR_RETURN(std::string_view module, ReadLine());
      CKPTFS_ASSIGN_OR_RETURN(std::string_view name, ReadLine());
      return LoadGlobal(module, name);
    }
    case kStackGlobal:
      return LoadStackGlobal();
    case kReduce:
      return LoadReduce();
    case kBuild: {  // sets an object's state: attributes are not kept
      CKPTFS_RETURN_IF_ERROR(Pop().status());
      return Top().status();
    }
    case kNewObj:
      return LoadNewObj(false);
    case kNewObjEx:
      return LoadNewObj(true);
    case kInst: {  // INST module\nname\n: a class called with the marked arguments
      CKPTFS_RETURN_IF_ERROR(ReadLine().status());
      CKPTFS_RETURN_IF_ERROR(ReadLine().status());
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      stack_.resize(from);
      return PushOpaque();
    }
    case kObj: {  // the class is the first marked entry
      CKPTFS_ASSIGN_OR_RETURN(size_t from, PopMark());
      if (stack_.size() == from) return Underflow();
      stack_.resize(from);
      return PushOpaque();
    }
    case kExt1:
    case kExt2:
    case kExt4:  // a global from the copyreg extension registry
      CKPTFS_RETURN_IF_ERROR(Read(op == kExt1 ? 1 : op == kExt2 ? 2 : 4).status());
      return PushOpaque();
    case kBinPersId:
      return LoadBinPersId();
    case kPersId:
      return Status::Corruption("pickle: a text persistent id is not a torch storage");
    default:
      return Unsupported(op);
  }
}

Status Unpickler::StepMemo(uint8_t op) {
  switch (op) {
    case kPut:
    case kGet: {
      CKPTFS_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      uint64_t index = 0;
      auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), index);
      if (ec != std::errc() || end != line.data() + line.size()) {
        return Status::Corruption("pickle: a memo index is not a number");
      }
      return op == kPut ? Put(index) : Get(index);
    }
    case kBinPut: {
      CKPTFS_ASSIGN_OR_RETURN(uint8_t index, ReadLE<uint8_t>());
      return Put(index);
    }
    case kLongBinPut: {
      CKPTFS_ASSIGN_OR_RETURN(uint32_t index, ReadLE<uint32_t>());
      return Put(index);
    }
    case kMemoize:
      return Put(memo_.size());
    case kBinGet: {
      CKPTFS_ASSIGN_OR_RETURN(uint8_t index, ReadLE<uint8_t>());
      return Get(index);
    }
    case kLongBinGet: {
      CKPTFS_ASSIGN_OR_RETURN(uint32_t index, ReadLE<uint32_t>());
      return Get(index);
    }
    default:
      return Unsupported(op);
  }
}

// INT ("I123\n", "I01\n" is True) and LONG ("L123L\n").
Status Unpickler::LoadTextInt(bool is_long) {
  CKPTFS_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
  if (!is_long && (line == "00" || line == "01")) {
    CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kBool));
    node(id).i = line == "01";
    return Push(id);
  }
  if (is_long && line.ends_with('L')) line.remove_suffix(1);
  if (!line.empty() && line[0] == '+') line.remove_prefix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
  if (end != line.data() + line.size() || line.empty()) {
    return Status::Corruption("pickle: INT is not a number");
  }
  if (ec == std::errc::result_out_of_range) return PushNew(Kind::kBigInt);
  if (ec != std::errc()) return Status::Corruption("pickle: INT is not a number");
  return PushInt(v);
}

// LONG1 and LONG4: a little-endian two's complement integer of the given number of bytes.
Status Unpickler::LoadLong(size_t width) {
  size_t n;
  if (width == 1) {
    CKPTFS_ASSIGN_OR_RETURN(n, ReadLength(1));
  } else {
    CKPTFS_ASSIGN_OR_RETURN(int32_t len, ReadLE<int32_t>());
    if (len < 0) return Status::Corruption("pickle: LONG4 with a negative length");
    if (static_cast<size_t>(len) > in_.size() - pos_) return Truncated();
    n = static_cast<size_t>(len);
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string_view bytes, Read(n));
  if (n > 8) return PushNew(Kind::kBigInt);
  uint64_t v = 0;
  for (size_t k = 0; k < n; ++k) v |= uint64_t{static_cast<uint8_t>(bytes[k])} << (8 * k);
  if (n > 0 && n < 8 && (static_cast<uint8_t>(bytes[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
  return PushInt(static_cast<int64_t>(v));
}

Status Unpickler::LoadString(Kind kind, size_t width, bool signed_length) {
  size_t n;
  if (signed_length) {
    CKPTFS_ASSIGN_OR_RETURN(int32_t len, ReadLE<int32_t>());
    if (len < 0) return Status::Corruption("pickle: BINSTRING with a negative length");
    if (static_cast<size_t>(len) > in_.size() - pos_) return Truncated();
    n = static_cast<size_t>(len);
  } else {
    CKPTFS_ASSIGN_OR_RETURN(n, ReadLength(width));
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string_view text, Read(n));
  return PushText(kind, text);
}

Status Unpickler::LoadGlobal(std::string_view module, std::string_view name) {
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kGlobal));
  Node& g = node(id);
  g.text = module;
  g.name = name;
  for (const CallableName& c : kCallables) {
    if (c.module == module && c.name == name) g.callable = c.callable;
  }
  for (const StorageName& s : kStorageTypes) {
    if (s.module == module && s.name == name) {
      g.callable = Callable::kStorageType;
      g.dtype = s.dtype;
    }
  }
  if (module == "torch") {
    if (std::optional<DType> t = DTypeFromName(name)) {
      g.callable = Callable::kDType;
      g.dtype = *t;
    }
  }
  if (g.callable == Callable::kOther &&
      index_.opaque_globals.size() < TorchPickleIndex::kMaxListedGlobals &&
      module.size() + name.size() < kMaxKeyBytes) {
    bool listed = false;
    for (const std::string& s : index_.opaque_globals) {
      listed = listed || (s.size() == module.size() + 1 + name.size() && s.starts_with(module) &&
                          s[module.size()] == '.' && s.ends_with(name));
    }
    if (!listed) index_.opaque_globals.push_back(DottedName(module, name));
  }
  return Push(id);
}

Status Unpickler::LoadStackGlobal() {
  CKPTFS_ASSIGN_OR_RETURN(NodeId name, Pop());
  CKPTFS_ASSIGN_OR_RETURN(NodeId module, Pop());
  if (node(name).kind != Kind::kString || node(module).kind != Kind::kString) {
    return Status::Corruption("pickle: STACK_GLOBAL of something other than two str");
  }
  return LoadGlobal(node(module).text, node(name).text);
}

Status Unpickler::LoadReduce() {
  CKPTFS_ASSIGN_OR_RETURN(NodeId args, Pop());
  CKPTFS_ASSIGN_OR_RETURN(NodeId callable, Pop());
  if (node(args).kind != Kind::kTuple && node(args).kind != Kind::kOpaque) {
    return Status::Corruption("pickle: REDUCE with arguments that are not a tuple");
  }
  CKPTFS_ASSIGN_OR_RETURN(NodeId result, Call(callable, args));
  return Push(result);
}

// NEWOBJ (cls, args) and NEWOBJ_EX (cls, args, kwargs): cls.__new__(cls, *args).
Status Unpickler::LoadNewObj(bool ex) {
  if (ex) CKPTFS_RETURN_IF_ERROR(Pop().status());
  CKPTFS_RETURN_IF_ERROR(Pop().status());
  CKPTFS_ASSIGN_OR_RETURN(NodeId cls, Pop());
  const Node& c = node(cls);
  if (c.kind == Kind::kGlobal && c.callable == Callable::kOrderedDict) {
    return PushNew(Kind::kDict);  // filled by SETITEMS
  }
  return PushOpaque();
}

Result<NodeId> Unpickler::Call(NodeId callable, NodeId args_id) {
  const Node& c = node(callable);
  const Node& a = node(args_id);
  if (c.kind != Kind::kGlobal || a.kind != Kind::kTuple) return NewNode(Kind::kOpaque);
  const std::vector<NodeId> args = a.items;  // a copy: new nodes may move `a`
  switch (c.callable) {
    case Callable::kRebuildTensor:
    case Callable::kRebuildTensorV2:
      return RebuildTensor(args);
    case Callable::kRebuildParameter:
    case Callable::kRebuildParameterWithState: {
      const size_t want = c.callable == Callable::kRebuildParameter ? 3 : 4;
      if (args.size() != want) {
        return Status::Corruption("pickle: _rebuild_parameter with " + std::to_string(args.size()) +
                                  " arguments");
      }
      const Kind data = node(args[0]).kind;
      if (data == Kind::kTensor || data == Kind::kOpaque) return args[0];
      return Status::Corruption("pickle: _rebuild_parameter of something other than a tensor");
    }
    case Callable::kRebuildFromTypeV2: {  // func(*args), then as_subclass(new_type)
      if (args.size() != 4) {
        return Status::Corruption("pickle: _rebuild_from_type_v2 with " +
                                  std::to_string(args.size()) + " arguments");
      }
      const Node& func = node(args[0]);
      const bool rebuilds_tensor =
          func.kind == Kind::kGlobal && (func.callable == Callable::kRebuildTensor ||
                                         func.callable == Callable::kRebuildTensorV2);
      if (!rebuilds_tensor || node(args[2]).kind != Kind::kTuple) return NewNode(Kind::kOpaque);
      const std::vector<NodeId> inner = node(args[2]).items;
      return RebuildTensor(inner);
    }
    case Callable::kOrderedDict:
      return MakeOrderedDict(args);
    case Callable::kOther:
    case Callable::kStorageType:
    case Callable::kDType:
      break;
  }
  return NewNode(Kind::kOpaque);
}

Result<std::vector<int64_t>> Unpickler::IntTuple(NodeId id, const char* what) {
  const Node& t = node(id);
  if (t.kind != Kind::kTuple && t.kind != Kind::kList) {
    return Status::Corruption(std::string("pickle: a tensor's ") + what + " is not a tuple");
  }
  std::vector<int64_t> out;
  out.reserve(t.items.size());
  for (NodeId item : t.items) {
    const Node& v = node(item);
    if (v.kind != Kind::kInt || v.i < 0) {
      return Status::Corruption(std::string("pickle: a tensor's ") + what +
                                " has an entry that is not a non-negative int");
    }
    out.push_back(v.i);
  }
  return out;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[,
// metadata]) and _rebuild_tensor(storage, storage_offset, size, stride): checked as torch's
// Tensor.set_ checks them.
Result<NodeId> Unpickler::RebuildTensor(const std::vector<NodeId>& args) {
  if (args.size() < 4) {
    return Status::Corruption("pickle: _rebuild_tensor with " + std::to_string(args.size()) +
                              " arguments");
  }
  const Node& storage = node(args[0]);
  if (storage.kind == Kind::kOpaque) return NewNode(Kind::kOpaque);  // e.g. an unknown type
  if (storage.kind != Kind::kStorage) {
    return Status::Corruption("pickle: a tensor of something other than a storage");
  }
  const Node& offset = node(args[1]);
  if (offset.kind != Kind::kInt || offset.i < 0) {
    return Status::Corruption("pickle: a tensor's storage offset is not a non-negative int");
  }
  TensorMeta t;
  t.storage = static_cast<size_t>(storage.i);
  t.offset = offset.i;
  CKPTFS_ASSIGN_OR_RETURN(t.shape, IntTuple(args[2], "size"));
  CKPTFS_ASSIGN_OR_RETURN(t.stride, IntTuple(args[3], "stride"));
  if (t.shape.size() != t.stride.size()) {
    return Status::Corruption("pickle: a tensor's size and stride differ in length");
  }
  CKPTFS_RETURN_IF_ERROR(CountCopies(2 * t.shape.size()));
  // The elements it spans: 1 + sum((size - 1) * stride), or 0 when any size is 0.
  uint64_t span = 1;
  bool empty = false;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    const auto size = static_cast<uint64_t>(t.shape[d]);
    if (size == 0) empty = true;
    uint64_t reach;
    if (__builtin_mul_overflow(size == 0 ? 0 : size - 1, static_cast<uint64_t>(t.stride[d]),
                               &reach) ||
        __builtin_add_overflow(span, reach, &span) ||
        __builtin_mul_overflow(t.numel, size, &t.numel)) {
      return Status::Corruption("pickle: a tensor's size overflows");
    }
  }
  const TorchStorage& s = index_.storages[t.storage];
  uint64_t end;
  if (!empty &&
      (__builtin_add_overflow(span, static_cast<uint64_t>(t.offset), &end) || end > s.numel)) {
    return Status::Corruption("pickle: a tensor runs past the end of storage " + s.key);
  }
  if (tensors_.size() >= limits_.max_objects) return TooMany("tensors", limits_.max_objects);
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kTensor));
  node(id).i = static_cast<int64_t>(tensors_.size());
  tensors_.push_back(std::move(t));
  return id;
}

// OrderedDict() or OrderedDict(iterable of pairs).
Result<NodeId> Unpickler::MakeOrderedDict(const std::vector<NodeId>& args) {
  if (args.size() > 1) return NewNode(Kind::kOpaque);
  std::vector<NodeId> pairs;
  if (args.size() == 1) {
    const Node& items = node(args[0]);
    if (items.kind != Kind::kList && items.kind != Kind::kTuple) return NewNode(Kind::kOpaque);
    for (NodeId p : items.items) {
      const Node& pair = node(p);
      if ((pair.kind != Kind::kList && pair.kind != Kind::kTuple) || pair.items.size() != 2) {
        return NewNode(Kind::kOpaque);
      }
      pairs.push_back(pair.items[0]);
      pairs.push_back(pair.items[1]);
    }
    CKPTFS_RETURN_IF_ERROR(CountCopies(pairs.size()));
  }
  CKPTFS_ASSIGN_OR_RETURN(NodeId dict, NewNode(Kind::kDict));
  for (size_t k = 0; k < pairs.size(); k += 2) {
    CKPTFS_RETURN_IF_ERROR(SetItem(dict, pairs[k], pairs[k + 1]));
  }
  return dict;
}

// ('storage', <T>Storage, key, location, numel), as torch.load's persistent_load reads it.
Status Unpickler::LoadBinPersId() {
  CKPTFS_ASSIGN_OR_RETURN(NodeId pid, Pop());
  const Node& t = node(pid);
  auto is_text = [&](NodeId id) {
    const Kind k = node(id).kind;
    return k == Kind::kString || k == Kind::kBytes;
  };
  if (t.kind != Kind::kTuple || t.items.size() != 5 || !is_text(t.items[0]) ||
      node(t.items[0]).text != "storage" || node(t.items[1]).kind != Kind::kGlobal ||
      !is_text(t.items[2]) || !is_text(t.items[3]) || node(t.items[4]).kind != Kind::kInt) {
    return Status::Corruption(
        "pickle: a persistent id is not ('storage', type, key, location, numel)");
  }
  const Node& type = node(t.items[1]);
  if (type.callable != Callable::kStorageType) return PushOpaque();
  const std::string_view key = node(t.items[2]).text;
  const int64_t numel = node(t.items[4]).i;
  const std::string_view location = node(t.items[3]).text;
  if (key.empty() || key.size() > kMaxKeyBytes || location.size() > kMaxKeyBytes || numel < 0) {
    return Status::Corruption(
        "pickle: a storage with an empty or overlong key or location, or a negative size");
  }
  auto it = storage_by_key_.find(key);
  size_t index;
  if (it != storage_by_key_.end()) {
    index = it->second;  // as torch.load: the first id with this key defines the storage
  } else {
    uint64_t nbytes;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel), ElementSize(type.dtype), &nbytes) ||
        nbytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::Corruption("pickle: a storage's size overflows");
    }
    if (index_.storages.size() >= limits_.max_objects) {
      return TooMany("storages", limits_.max_objects);
    }
    index = index_.storages.size();
    index_.storages.push_back({.key = std::string(key),
                               .dtype = type.dtype,
                               .numel = static_cast<uint64_t>(numel),
                               .nbytes = nbytes,
                               .location = std::string(location)});
    storage_by_key_.emplace(key, index);  // a view of the input, which outlives the map
  }
  CKPTFS_ASSIGN_OR_RETURN(NodeId id, NewNode(Kind::kStorage));
  node(id).i = static_cast<int64_t>(index);
  return Push(id);
}

// Sets the (key, value) pairs on the stack from `from` on into `dict`, and drops them.
Status Unpickler::LoadDict(size_t from, NodeId dict) {
  if ((stack_.size() - from) % 2 != 0) {
    return Status::Corruption("pickle: a dict's items are not (key, value) pairs");
  }
  const Kind kind = node(dict).kind;
  if (kind != Kind::kDict && kind != Kind::kOpaque) {
    return Status::Corruption("pickle: SETITEM(S) on something other than a dict");
  }
  if (kind == Kind::kDict) {
    for (size_t k = from; k < stack_.size(); k += 2) {
      CKPTFS_RETURN_IF_ERROR(SetItem(dict, stack_[k], stack_[k + 1]));
    }
  }
  stack_.resize(from);
  return Status::OK();
}

Status Unpickler::LoadAppends(size_t from, NodeId list) {
  const Kind kind = node(list).kind;
  if (kind != Kind::kList && kind != Kind::kOpaque) {
    return Status::Corruption("pickle: APPEND(S) to something other than a list");
  }
  if (kind == Kind::kList) {
    std::vector<NodeId>& items = node(list).items;
    items.insert(items.end(), stack_.begin() + from, stack_.end());
  }
  stack_.resize(from);
  return Status::OK();
}

std::optional<DictKey> Unpickler::HashKey(NodeId id) const {
  const Node& k = node(id);
  switch (k.kind) {
    case Kind::kNone:
      return DictKey{.tag = 'n'};
    case Kind::kBool:
    case Kind::kInt:
      return DictKey{.tag = 'i', .i = k.i};
    case Kind::kFloat:
      if (k.f >= -9.2e18 && k.f <= 9.2e18 &&
          k.f == static_cast<double>(static_cast<int64_t>(k.f))) {
        return DictKey{.tag = 'i', .i = static_cast<int64_t>(k.f)};
      }
      return DictKey{.tag = 'f', .i = std::bit_cast<int64_t>(k.f)};
    case Kind::kString:
    case Kind::kBytes:
      if (k.text.size() > kMaxKeyBytes) return std::nullopt;
      return DictKey{.tag = k.kind == Kind::kString ? 's' : 'b', .a = k.text};
    case Kind::kGlobal:
      if (k.text.size() + k.name.size() > kMaxKeyBytes) return std::nullopt;
      return DictKey{.tag = 'g', .a = k.text, .b = k.name};
    default:
      return std::nullopt;  // compared by identity (or by contents, not modelled)
  }
}

Status Unpickler::CountCopies(size_t n) {
  copied_items_ += n;
  if (copied_items_ > limits_.max_objects) return TooMany("copied items", limits_.max_objects);
  return Status::OK();
}

Status Unpickler::SetItem(NodeId dict, NodeId key, NodeId value) {
  const Kind kind = node(key).kind;
  if (kind == Kind::kList || kind == Kind::kDict) {
    return Status::Corruption("pickle: a dict key that is a list or a dict");
  }
  Node& d = node(dict);
  std::optional<DictKey> hash = HashKey(key);
  if (hash) {
    if (d.keys == nullptr) d.keys = std::make_unique<DictKeys>();
    auto [it, inserted] = d.keys->try_emplace(*hash, static_cast<uint32_t>(d.items.size()));
    if (!inserted) {  // d[key] = value keeps the first key and its place
      d.items[it->second + 1] = value;
      return Status::OK();
    }
  }
  d.items.push_back(key);
  d.items.push_back(value);
  return Status::OK();
}

void Unpickler::AppendKey(NodeId key, std::string* path) const {
  const Node& k = node(key);
  switch (k.kind) {
    case Kind::kString:
    case Kind::kBytes:
      path->append(k.text);
      break;
    case Kind::kInt:
      path->append(std::to_string(k.i));
      break;
    case Kind::kBool:
      path->append(k.i ? "True" : "False");
      break;
    case Kind::kNone:
      path->append("None");
      break;
    case Kind::kFloat:
      path->append(FloatKey(k.f));
      break;
    default:
      path->append("?");
      break;
  }
}

Status Unpickler::Emit(NodeId tensor, const std::string& path) {
  if (index_.tensors.size() >= limits_.max_tensors) {
    return TooMany("tensor paths", limits_.max_tensors);
  }
  const TensorMeta& t = tensors_[static_cast<size_t>(node(tensor).i)];
  const TorchStorage& s = index_.storages[t.storage];
  index_bytes_ += path.size() + s.key.size() + 2 * sizeof(int64_t) * t.shape.size();
  if (index_bytes_ > limits_.max_index_bytes) {
    return TooMany("bytes of tensors reported", limits_.max_index_bytes);
  }
  index_.tensors.push_back({.path = path,
                            .storage_key = s.key,
                            .dtype = s.dtype,
                            .shape = t.shape,
                            .stride = t.stride,
                            .storage_offset = t.offset,
                            .numel = t.numel});
  return Status::OK();
}

// Depth-first, in pickle order, with an explicit stack; a container already on the path (a
// cycle) is skipped.
Status Unpickler::Walk(NodeId root) {
  struct Frame {
    NodeId container;
    size_t next = 0;      // the next item (dicts: the next key)
    size_t path_len = 0;  // of `path` before this container's keys
  };
  const size_t max_steps = 2 * limits_.max_objects;
  size_t steps = 0;
  std::vector<Frame> frames;
  std::vector<bool> on_path(nodes_.size());
  std::string path;
  auto enter = [&](NodeId id) -> Status {
    if (++steps > max_steps) return TooMany("walk steps", max_steps);
    const Kind kind = node(id).kind;
    if (kind == Kind::kTensor) return Emit(id, path);
    if (kind != Kind::kDict && kind != Kind::kList && kind != Kind::kTuple) return Status::OK();
    if (on_path[id]) return Status::OK();
    if (frames.size() >= limits_.max_depth) {
      return Status::InvalidArgument("pickle: nested deeper than the limit of " +
                                     std::to_string(limits_.max_depth));
    }
    on_path[id] = true;
    frames.push_back({.container = id, .next = 0, .path_len = path.size()});
    return Status::OK();
  };
  CKPTFS_RETURN_IF_ERROR(enter(root));
  while (!frames.empty()) {
    Frame& f = frames.back();
    const Node& c = node(f.container);
    const bool dict = c.kind == Kind::kDict;
    if (f.next >= c.items.size()) {
      on_path[f.container] = false;
      path.resize(f.path_len);
      frames.pop_back();
      continue;
    }
    path.resize(f.path_len);
    if (frames.size() > 1) path += '.';
    NodeId child;
    if (dict) {
      AppendKey(c.items[f.next], &path);
      child = c.items[f.next + 1];
      f.next += 2;
      walk_bytes_ += path.size() - f.path_len;
      if (walk_bytes_ > limits_.max_index_bytes) {
        return TooMany("bytes of dict keys walked", limits_.max_index_bytes);
      }
    } else {
      path += std::to_string(f.next);
      child = c.items[f.next];
      f.next += 1;
    }
    CKPTFS_RETURN_IF_ERROR(enter(child));  // may invalidate f
  }
  return Status::OK();
}

}  // namespace

Result<TorchPickleIndex> ParseTorchPickle(Bytes pkl, const TorchPickleLimits& limits) {
  Unpickler unpickler(pkl, limits);
  return unpickler.Run();
}

namespace {

void PutOp(std::string* out, pickle::Op op) { out->push_back(static_cast<char>(op)); }

void PutText(std::string* out, std::string_view s) {
  PutOp(out, pickle::kBinUnicode);
  const auto n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(s);
}

void PutInt(std::string* out, uint64_t v) {
  if (v <= 0x7fffffff) {
    PutOp(out, pickle::kBinInt);
    for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return;
  }
  // Little-endian two's complement in 8 bytes (sizes and counts stay below 2^63), or 9 so the
  // sign stays positive.
  const bool nine = v >> 63;
  PutOp(out, pickle::kLong1);
  out->push_back(nine ? 9 : 8);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  if (nine) out->push_back(0);
}

void PutGlobal(std::string* out, std::string_view module, std::string_view name) {
  PutOp(out, pickle::kGlobal);
  out->append(module);
  out->push_back('\n');
  out->append(name);
  out->push_back('\n');
}

void PutIntTuple(std::string* out, const std::vector<uint64_t>& values) {
  PutOp(out, pickle::kMark);
  for (uint64_t v : values) PutInt(out, v);
  PutOp(out, pickle::kTuple);
}

}  // namespace

Result<std::string> WriteTorchStateDictPickle(const std::vector<TorchTensorOut>& tensors) {
  std::string out;
  PutOp(&out, pickle::kProto);
  out.push_back(2);
  PutOp(&out, pickle::kEmptyDict);
  PutOp(&out, pickle::kMark);
  for (const TorchTensorOut& t : tensors) {
    const StorageName* storage = nullptr;
    for (const StorageName& s : kStorageTypes) {
      if (s.dtype == t.dtype && s.module == "torch" && !s.name.ends_with("UntypedStorage")) {
        storage = &s;
        break;
      }
    }
    if (storage == nullptr) {
      return Status::NotSupported("tensor " + t.name + ": torch has no storage type for " +
                                  std::string(DTypeName(t.dtype)));
    }
    uint64_t numel = 1;
    for (uint64_t d : t.shape) numel *= d;
    std::vector<uint64_t> stride(t.shape.size());
    uint64_t step = 1;
    for (size_t i = t.shape.size(); i-- > 0;) {
      stride[i] = step;
      step *= t.shape[i];
    }
    PutText(&out, t.name);
    // _rebuild_tensor_v2(('storage', torch.<T>Storage, key, 'cpu', numel), 0, shape, stride,
    //                    False, OrderedDict())
    PutGlobal(&out, "torch._utils", "_rebuild_tensor_v2");
    PutOp(&out, pickle::kMark);
    PutOp(&out, pickle::kMark);
    PutText(&out, "storage");
    PutGlobal(&out, storage->module, storage->name);
    PutText(&out, t.storage_key);
    PutText(&out, "cpu");
    PutInt(&out, numel);
    PutOp(&out, pickle::kTuple);
    PutOp(&out, pickle::kBinPersId);
    PutInt(&out, 0);
    PutIntTuple(&out, t.shape);
    PutIntTuple(&out, stride);
    PutOp(&out, pickle::kNewFalse);
    PutGlobal(&out, "collections", "OrderedDict");
    PutOp(&out, pickle::kEmptyTuple);
    PutOp(&out, pickle::kReduce);
    PutOp(&out, pickle::kTuple);
    PutOp(&out, pickle::kReduce);
  }
  PutOp(&out, pickle::kSetItems);
  PutOp(&out, pickle::kStop);
  return out;
}

}  // namespace ckptfs
