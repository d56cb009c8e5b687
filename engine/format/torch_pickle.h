// engine/format/torch_pickle.h
//
// Reads the tensor layout out of a torch.save checkpoint's data.pkl without executing it:
//
//   Result<TorchPickleIndex> index = ParseTorchPickle(data_pkl);
//   for (const TorchTensor& t : index->tensors) {
//     // t.path "model.layers.0.weight", t.storage_key "3": its bytes are the zip record
//     // <archive>/data/3, from t.storage_offset * ElementSize(t.dtype) on.
//   }
//
// The pickle (protocols 1 to 5; torch 1.13 writes 2) is interpreted into a value tree of None,
// bool, int, float, str/bytes, tuple, list and dict, and nothing is ever called. Of the globals
// it names only an allow-list is understood: torch._utils._rebuild_tensor(_v2),
// torch._utils._rebuild_parameter(_with_state), torch._tensor._rebuild_from_type_v2,
// collections.OrderedDict, torch.<T>Storage / torch(.storage).UntypedStorage as storage types,
// and torch.<dtype>. Anything else (a class, os.system, torch.Size, a quantized tensor) is an
// opaque object: it fails nothing, and no tensor is reported inside it. Persistent ids
// ('storage', <T>Storage, key, location, numel) are the storages; as torch.load does, the first
// id with a given key defines that storage (dtype, numel).
//
// Tensors are reported for every path from the root through dicts (keys joined by '.'), lists
// and tuples (indices) to a tensor, in pickle order: {'state': {0: {'exp_avg': T}}} gives
// "state.0.exp_avg"; a tensor reachable by two paths is reported twice; a root that is itself a
// tensor has path "". Storages are reported in the order their keys first appear, whether or
// not a reported tensor uses them (those inside opaque objects too).
//
// Input is untrusted: memory is bounded by the limits below (about 100 bytes per object, and
// never more objects than input bytes; strings are views of the input, not copies), the tree is
// walked without recursion, and cycles are skipped. Malformed pickles,
// and tensors torch.load would refuse (bad arguments, out of the storage's bounds), give
// Corruption; input past a limit gives InvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/format/dtype.h"
#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

struct TorchStorage {
  std::string key;  // the zip record is <archive>/data/<key>; 1 to 256 bytes, any of them
  DType dtype = DType::kU8;
  uint64_t numel = 0;    // elements
  uint64_t nbytes = 0;   // numel * ElementSize(dtype)
  std::string location;  // "cpu", "cuda:0", ...
};

struct TorchTensor {
  std::string path;         // "module.layers.0.weight"
  std::string storage_key;  // a TorchStorage's key
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // empty for a 0-d tensor
  std::vector<int64_t> stride;  // elements, one per dimension
  int64_t storage_offset = 0;   // elements
  uint64_t numel = 0;           // product of shape (1 for 0-d)
};

// A top-level entry of a checkpoint dict whose value is a number, a bool or a string, such as
// Lightning's {'epoch': 3, 'global_step': 400, 'pytorch-lightning_version': '2.1.0'} or
// DeepSpeed's {'ds_version': '0.12.3', 'global_steps': 77}.
struct TorchScalar {
  enum class Kind : uint8_t { kInt, kFloat, kBool, kString };
  std::string key;
  Kind kind = Kind::kInt;
  int64_t i = 0;     // kInt, kBool
  double f = 0;      // kFloat
  std::string text;  // kString
};

struct TorchPickleIndex {
  std::vector<TorchStorage> storages;
  std::vector<TorchTensor> tensors;
  // When the root is a dict: its entries with a string key (at most kMaxScalarKeyBytes) and a
  // scalar value (strings of at most kMaxScalarTextBytes), in the dict's order, at most
  // kMaxScalars; longer keys and strings are skipped.
  std::vector<TorchScalar> scalars;
  static constexpr size_t kMaxScalars = 64;
  static constexpr size_t kMaxScalarKeyBytes = 128;
  static constexpr size_t kMaxScalarTextBytes = 256;
  // Globals outside the allow-list, as "module.name", each once, at most kMaxListedGlobals.
  std::vector<std::string> opaque_globals;
  static constexpr size_t kMaxListedGlobals = 32;
};

struct TorchPickleLimits {
  size_t max_pickle_bytes = size_t{1} << 30;
  size_t max_objects = size_t{1} << 22;  // values built, memo entries, stack and mark depth
  size_t max_depth = 100;                // nesting of dicts, lists and tuples on a tensor's path
  size_t max_tensors = size_t{1} << 20;  // paths reported
  size_t max_index_bytes = size_t{1} << 28;  // their paths, storage keys and dimensions; and
                                             // the dict keys the walk reads
  // The walk from the root takes at most 2 * max_objects steps (a value reachable by several
  // paths is visited once for each).
};

Result<TorchPickleIndex> ParseTorchPickle(Bytes pkl, const TorchPickleLimits& limits = {});

// A tensor of a state dict to write: contiguous (C order), on the CPU, in its own storage.
struct TorchTensorOut {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  std::string storage_key;  // the zip record <archive>/data/<key> holding its bytes
};

// The data.pkl that torch.save({name: tensor, ...}) writes for these tensors (protocol 2,
// torch._utils._rebuild_tensor_v2 with persistent storage ids, the globals the parser above
// allows): written by hand, no pickle code runs. NotSupported for a dtype torch has no storage
// type for.
Result<std::string> WriteTorchStateDictPickle(const std::vector<TorchTensorOut>& tensors);

}  // namespace ckptfs
