// Tests of ParseTorchPickle: on the data.pkl of real torch.save files (written by
// /usr/bin/python3, which sees Debian's torch), against what torch.load makes of them
// (engine/format/torch_pickle_testdata.py); and on hand-built pickles, malformed ones included.
#include "engine/format/torch_pickle.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;

const std::string kTestData =
    std::string(CKPTFS_SOURCE_DIR) + "/engine/format/torch_pickle_testdata.py";

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Dims(const std::vector<int64_t>& v) {
  if (v.empty()) return "-";
  std::string s;
  for (int64_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

// The lines torch_pickle_testdata.py writes for what torch.load finds.
std::vector<std::string> Describe(const TorchPickleIndex& index) {
  std::vector<std::string> lines;
  for (const TorchStorage& s : index.storages) {
    lines.push_back("S\t" + s.key + "\t" + std::string(DTypeName(s.dtype)) + "\t" +
                    std::to_string(s.numel) + "\t" + s.location);
  }
  for (const TorchTensor& t : index.tensors) {
    lines.push_back("T\t" + t.path + "\t" + t.storage_key + "\t" + std::string(DTypeName(t.dtype)) +
                    "\t" + std::to_string(t.storage_offset) + "\t" + Dims(t.shape) + "\t" +
                    Dims(t.stride));
  }
  return lines;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

const TorchTensor* Find(const TorchPickleIndex& index, const std::string& path) {
  for (const TorchTensor& t : index.tensors) {
    if (t.path == path) return &t;
  }
  return nullptr;
}

// Real checkpoints. CTest runs each test in its own process, so they are made once per version
// of the script, in a directory named after it, which the first process to finish renames
// into place.
class TorchPickleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const size_t version = std::hash<std::string>()(ReadText(kTestData));
    dir_ = fs::temp_directory_path() / ("ckptfs_torch_pickle_samples_" + std::to_string(version));
  }

  // Makes the samples unless made; their names, or none (with *skip set) without python/torch.
  static std::vector<std::string> Samples(std::string* skip) {
    if (!names_.empty()) return names_;
    if (::access("/usr/bin/python3", X_OK) != 0) {
      *skip = "no /usr/bin/python3";
      return {};
    }
    if (!fs::exists(dir_ / "names")) {
      if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
        *skip = "/usr/bin/python3 has no torch (apt-get install python3-torch)";
        return {};
      }
      const fs::path tmp = dir_.string() + ".tmp" + std::to_string(::getpid());
      fs::remove_all(tmp);
      const std::string cmd = "/usr/bin/python3 " + kTestData + " write " + tmp.string() + " > " +
                              tmp.string() + ".names";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
      fs::rename(tmp.string() + ".names", tmp / "names");
      std::error_code ec;
      fs::rename(tmp, dir_, ec);  // fails when another process got there first
      fs::remove_all(tmp);
    }
    names_ = Lines(ReadText(dir_ / "names"));
    return names_;
  }
  static Bytes Pkl(const std::string& name) {
    auto [it, _] = pkls_.try_emplace(name, ReadText(dir_ / (name + ".pkl")));
    return AsBytes(it->second);
  }
  static std::vector<std::string> Expected(const std::string& name) {
    return Lines(ReadText(dir_ / (name + ".txt")));
  }
  static TorchPickleIndex Parse(const std::string& name) {
    Result<TorchPickleIndex> index = ParseTorchPickle(Pkl(name));
    EXPECT_TRUE(index.ok()) << name << ": " << index.status().ToString();
    return index.ok() ? std::move(*index) : TorchPickleIndex{};
  }

  static inline fs::path dir_;
  static inline std::vector<std::string> names_;
  static inline std::map<std::string, std::string> pkls_;
};

#define SKIP_WITHOUT_TORCH()                             \
  std::string skip;                                      \
  const std::vector<std::string> names = Samples(&skip); \
  if (!skip.empty()) GTEST_SKIP() << skip;               \
  ASSERT_FALSE(names.empty())

TEST_F(TorchPickleTest, MatchesTorchLoadOnRealCheckpoints) {
  SKIP_WITHOUT_TORCH();
  for (const char* want : {"state_dict", "adam", "nested", "nested_protocol1", "nested_protocol3",
                           "nested_protocol4", "nested_protocol5", "tied", "views", "dtypes",
                           "deepspeed", "objects", "many", "root_tensor", "root_list", "cycle"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const TorchPickleIndex index = Parse(name);
    EXPECT_EQ(Describe(index), Expected(name));
    for (const TorchStorage& s : index.storages) {
      EXPECT_EQ(s.nbytes, s.numel * ElementSize(s.dtype));
    }
    for (const TorchTensor& t : index.tensors) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      EXPECT_EQ(t.numel, numel) << t.path;
    }
  }
}

TEST_F(TorchPickleTest, DescribesTiedWeightsAndViewsExactly) {
  SKIP_WITHOUT_TORCH();
  const TorchPickleIndex tied = Parse("tied");
  ASSERT_EQ(tied.storages.size(), 1u);
  const TorchTensor* emb = Find(tied, "emb.weight");
  const TorchTensor* head = Find(tied, "head.weight");
  ASSERT_TRUE(emb && head);
  EXPECT_EQ(emb->storage_key, head->storage_key);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{10, 6}));

  const TorchPickleIndex views = Parse("views");
  ASSERT_EQ(views.storages.size(), 2u);  // base's, and expand's
  EXPECT_EQ(views.storages[0].numel, 80u);
  const TorchTensor* row = Find(views, "row");
  const TorchTensor* t = Find(views, "t");
  const TorchTensor* slice = Find(views, "slice");
  const TorchTensor* expand = Find(views, "expand");
  ASSERT_TRUE(row && t && slice && expand);
  EXPECT_EQ(row->storage_offset, 30);
  EXPECT_EQ(t->stride, (std::vector<int64_t>{1, 10}));
  EXPECT_EQ(slice->storage_offset, 21);
  EXPECT_EQ(slice->shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(slice->stride, (std::vector<int64_t>{10, 2}));
  EXPECT_EQ(expand->stride, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(expand->storage_key, views.storages[1].key);

  const TorchPickleIndex dtypes = Parse("dtypes");
  const TorchTensor* scalar = Find(dtypes, "scalar");
  const TorchTensor* empty = Find(dtypes, "empty3");
  const TorchTensor* bf16 = Find(dtypes, "bfloat16");
  ASSERT_TRUE(scalar && empty && bf16);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel, 1u);
  EXPECT_EQ(scalar->dtype, DType::kI64);
  EXPECT_EQ(empty->numel, 0u);
  EXPECT_EQ(empty->dtype, DType::kF16);
  EXPECT_EQ(bf16->dtype, DType::kBF16);
}

TEST_F(TorchPickleTest, ReadsADeepSpeedLayoutAndKeepsObjectsOpaque) {
  SKIP_WITHOUT_TORCH();
  const TorchPickleIndex index = Parse("deepspeed");
  EXPECT_TRUE(Find(index, "module.0.weight"));
  EXPECT_TRUE(Find(index, "optimizer.state.0.exp_avg"));
  EXPECT_TRUE(Find(index, "optimizer.state.5.exp_avg_sq"));
  EXPECT_TRUE(Find(index, "optimizer.state.0.step"));
  for (const TorchTensor& t : index.tensors) {
    EXPECT_TRUE(t.path.starts_with("module.") || t.path.starts_with("optimizer.")) << t.path;
  }
  // Holder(torch.ones(5)): its storage is listed (it is a record of the zip), no tensor path.
  EXPECT_EQ(index.storages.back().numel, 5u);
  for (const char* g : {"torch.Size", "argparse.Namespace", "__main__.Holder"}) {
    EXPECT_NE(std::find(index.opaque_globals.begin(), index.opaque_globals.end(), g),
              index.opaque_globals.end())
        << g;
  }
}

TEST_F(TorchPickleTest, TruncatedPicklesFailCleanly) {
  SKIP_WITHOUT_TORCH();
  for (const char* name : {"adam", "nested_protocol4", "dtypes"}) {
    SCOPED_TRACE(name);
    const Bytes pkl = Pkl(name);
    for (size_t len = 0; len + 1 < pkl.size(); ++len) {
      Result<TorchPickleIndex> r = ParseTorchPickle(pkl.first(len));
      ASSERT_FALSE(r.ok()) << len;
      EXPECT_TRUE(r.status().IsCorruption()) << len << ": " << r.status().ToString();
    }
  }
}

TEST_F(TorchPickleTest, CorruptedBytesNeverCrash) {
  SKIP_WITHOUT_TORCH();
  std::mt19937_64 rng(5);
  for (const std::string& name : names) {
    std::string pkl(AsChars(Pkl(name)));
    for (int i = 0; i < 300; ++i) {
      std::string bad = pkl;
      for (int k = 0; k < 1 + i % 4; ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
      (void)ParseTorchPickle(AsBytes(bad));  // any status; ASan/UBSan builds check the rest
    }
  }
}

// Hand-built pickles.

// Concatenates (GCC 12 -O3 warns wrongly about "x" + std::string).
std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}
std::string Le32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string Str(std::string_view s) { return Cat({"X", Le32(static_cast<uint32_t>(s.size())), s}); }
std::string Int(int32_t v) { return Cat({"J", Le32(static_cast<uint32_t>(v))}); }
std::string Global(std::string_view module, std::string_view name) {
  return Cat({"c", module, "\n", name, "\n"});
}
std::string Tuple(std::initializer_list<int32_t> items) {
  std::string s = "(";
  for (int32_t v : items) s += Int(v);
  return s + "t";
}
// _rebuild_tensor_v2(('storage', torch.<type>, '0', 'cpu', numel), offset, shape, stride, ...),
// without PROTO and STOP.
std::string TensorOps(int32_t numel, int32_t offset, const std::string& shape,
                      const std::string& stride, std::string_view type = "FloatStorage") {
  return Global("torch._utils", "_rebuild_tensor_v2") + "((" + Str("storage") +
         Global("torch", type) + Str("0") + Str("cpu") + Int(numel) + "tQ" + Int(offset) + shape +
         stride + "\x89" + Global("collections", "OrderedDict") + ")R" + "tR";
}
std::string Pickle(const std::string& body) { return "\x80\x02"s + body + "."; }
// {'w': body}
std::string DictPickle(const std::string& value) {
  return Pickle(Cat({"}(", Str("w"), value, "u"}));
}
Result<TorchPickleIndex> Parse(const std::string& pkl, const TorchPickleLimits& limits = {}) {
  return ParseTorchPickle(AsBytes(pkl), limits);
}

TEST(TorchPickleBuiltTest, ChecksTensorsAsTorchSetDoes) {
  struct Case {
    int32_t numel, offset;
    std::string shape, stride;
    bool ok;
  };
  const std::vector<Case> cases = {
      {12, 0, Tuple({3, 4}), Tuple({4, 1}), true},
      {12, 3, Tuple({2, 4}), Tuple({5, 1}), true},    // ends exactly at 12
      {12, 4, Tuple({2, 4}), Tuple({5, 1}), false},   // one past
      {12, 0, Tuple({3, 4}), Tuple({1, 3}), true},    // transposed
      {1, 0, Tuple({}), Tuple({}), true},             // 0-d
      {0, 0, Tuple({}), Tuple({}), false},            // 0-d needs an element
      {0, 99, Tuple({0, 5}), Tuple({5, 1}), true},    // empty: any offset
      {4, 0, Tuple({4, 1000}), Tuple({1, 0}), true},  // expanded
      {4, 0, Tuple({4}), Tuple({1, 1}), false},       // size and stride differ in length
      {4, 0, Tuple({-1}), Tuple({1}), false},         // negative size
      {4, 0, Tuple({2}), Tuple({-1}), false},         // negative stride
      {4, -1, Tuple({2}), Tuple({1}), false},         // negative offset
      {4, 0, Tuple({65536, 65536, 65536, 65536}), Tuple({1, 1, 1, 1}), false},  // overflow
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Result<TorchPickleIndex> r = Parse(DictPickle(TensorOps(c.numel, c.offset, c.shape, c.stride)));
    ASSERT_EQ(r.ok(), c.ok) << i << ": " << r.status().ToString();
    if (!c.ok) {
      EXPECT_TRUE(r.status().IsCorruption()) << i;
      continue;
    }
    ASSERT_EQ(r->tensors.size(), 1u);
    EXPECT_EQ(r->tensors[0].path, "w");
    EXPECT_EQ(r->tensors[0].storage_offset, c.offset);
  }
}

TEST(TorchPickleBuiltTest, ReadsTextOpcodesAndProtocolFeatures) {
  // Shape (3, 4) as INT and LONG, stride as BININT1/BININT2, memo by PUT/GET and MEMOIZE,
  // STACK_GLOBAL, FRAME.
  const std::string shape = "(I3\nL4L\nt";
  const std::string stride = "(K\x04M\x01\x00t"s;
  std::string tensor = TensorOps(12, 0, shape, stride);
  const std::string body = "\x95"s + std::string(8, '\0') + "}p7\n(" + "\x8c\x01k" + "\x94" +
                           tensor + "g7\n" + "\x8c\x05torch\x8c\x07" + "float16\x93" + "u";
  // {'k': tensor, {}: ...} would be unhashable: the dict itself (GET 7) is the second key.
  Result<TorchPickleIndex> r = Parse("\x80\x04"s + body + ".");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();

  const std::string ok_body = "}p7\n(\x8c\x01k\x94" + tensor +
                              "\x8c\x02"
                              "dt"
                              "\x8c\x05"
                              "torch" +
                              "\x8c\x07" + "float16\x93" + "u";
  r = Parse("\x80\x04"s + "\x95" + std::string(8, '\0') + ok_body + ".");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].path, "k");
  EXPECT_EQ(r->tensors[0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r->tensors[0].stride, (std::vector<int64_t>{4, 1}));
  EXPECT_TRUE(r->opaque_globals.empty());  // torch.float16 is understood
}

TEST(TorchPickleBuiltTest, UnknownGlobalsAreOpaqueAndNeverRun) {
  // {'w': os.system('echo ...'), 'x': Foo.Bar(tensor), 't': tensor}
  const std::string call = Global("os", "system") + "(" + Str("touch /tmp/ckptfs_pwned") + "tR";
  const std::string wrapped =
      Global("foo", "Bar") + "(" + TensorOps(4, 0, Tuple({4}), Tuple({1})) + "tR";
  const std::string body = "}(" + Str("w") + call + Str("x") + wrapped + Str("t") +
                           TensorOps(4, 0, Tuple({2}), Tuple({2})) + "u";
  Result<TorchPickleIndex> r = Parse(Pickle(body));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].path, "t");
  EXPECT_EQ(r->tensors[0].stride, (std::vector<int64_t>{2}));
  EXPECT_EQ(r->storages.size(), 1u);  // both name storage '0'
  EXPECT_EQ(r->opaque_globals, (std::vector<std::string>{"os.system", "foo.Bar"}));
  EXPECT_FALSE(fs::exists("/tmp/ckptfs_pwned"));

  // A storage type that is not understood (quantized): an opaque tensor, no storage.
  r = Parse(DictPickle(TensorOps(4, 0, Tuple({4}), Tuple({1}), "QInt8Storage")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->tensors.empty());
  EXPECT_TRUE(r->storages.empty());
}

TEST_F(TorchPickleTest, PicklesOfOsSystemParseWithoutRunning) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const fs::path dir = dir_.string() + ".evil" + std::to_string(::getpid());
  const std::string cmd = "/usr/bin/python3 " + kTestData + " evil " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (const char* name : {"os_system_2.pkl", "os_system_4.pkl"}) {
    SCOPED_TRACE(name);
    const std::string pkl = ReadText(dir / name);
    Result<TorchPickleIndex> r = ParseTorchPickle(AsBytes(pkl));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->tensors.empty());
    EXPECT_EQ(r->opaque_globals, (std::vector<std::string>{"posix.system"}));
  }
  EXPECT_FALSE(fs::exists("/tmp/ckptfs_pwned"));
  fs::remove_all(dir);
}

TEST(TorchPickleBuiltTest, MalformedPicklesAreCorruption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"no STOP", "\x80\x02}"},
      {"STOP on an empty stack", "\x80\x02."},
      {"protocol 6", "\x80\x06N."},
      {"unknown opcode", "\x80\x02\xff."},
      {"huge BINUNICODE", "\x80\x02X\xff\xff\xff\xff."},
      {"huge BINUNICODE8", "\x80\x04\x8d" + std::string(7, '\xff') + "\x7f."},
      {"huge FRAME", "\x80\x04\x95" + std::string(8, '\xff') + "N."},
      {"negative LONG4", "\x80\x02\x8b\xff\xff\xff\xff."},
      {"unset memo", "\x80\x02h\x05."},
      {"MARK-less TUPLE", "\x80\x02Nt."},
      {"pop below a mark", "\x80\x02N(\x85."},
      {"odd SETITEMS", "\x80\x02}(NNNu."},
      {"SETITEM on a list", "\x80\x02]NNs."},
      {"APPEND to a dict", "\x80\x02}Na."},
      {"list as a key", "\x80\x02}]Ns."},
      {"REDUCE without a tuple", "\x80\x02" + Global("foo", "bar") + "NR."},
      {"invalid UTF-8", "\x80\x02X\x01\x00\x00\x00\xff."s},
      {"BINPERSID of a str", "\x80\x02" + Str("storage") + "Q."},
      {"text persistent id", "\x80\x02P0\n."},
      {"STACK_GLOBAL of ints", "\x80\x04K\x01K\x02\x93."},
      {"parameter of an int",
       "\x80\x02" + Global("torch._utils", "_rebuild_parameter") + "(K\x01\x88NtR."},
      {"tensor of an int",
       "\x80\x02" + Global("torch._utils", "_rebuild_tensor_v2") + "(K\x01K\x00)\x29\x89NtR."s},
  };
  for (const auto& [what, pkl] : cases) {
    Result<TorchPickleIndex> r = Parse(pkl);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_TRUE(r.status().IsCorruption()) << what << ": " << r.status().ToString();
  }
}

TEST(TorchPickleBuiltTest, LimitsBoundDepthObjectsAndPaths) {
  // Lists nested n deep: ]]]...]aaa...a
  auto nested = [](size_t n) {
    return "\x80\x02" + std::string(n, ']') + std::string(n - 1, 'a') + ".";
  };
  EXPECT_TRUE(Parse(nested(100)).ok());
  Result<TorchPickleIndex> r = Parse(nested(101));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  r = Parse(nested(200000));  // parsed without recursion, refused by the walk
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();

  TorchPickleLimits small;
  small.max_objects = 50;
  r = Parse(nested(60), small);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  r = Parse("\x80\x02" + std::string(100, '('), small);
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  small.max_pickle_bytes = 10;
  EXPECT_EQ(Parse(nested(20), small).status().code(), Status::Code::kInvalidArgument);

  // l0 = [1]; l(k+1) = [lk, lk]: 2^60 paths in 600 bytes.
  std::string dag =
      "\x80\x02]K\x01"
      "a";
  for (int k = 0; k < 60; ++k)
    dag +=
        "q\x00"
        "0](h\x00h\x00"
        "e"s;
  r = Parse(dag + ".");
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();

  // One tensor reached by many paths: [t, t, t, ...]
  std::string many = "\x80\x02](" + TensorOps(4, 0, Tuple({4}), Tuple({1})) + "q\x01";
  for (int k = 0; k < 99; ++k) many += "h\x01"s;
  many += "e.";
  r = Parse(many);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), 100u);
  EXPECT_EQ(r->tensors[99].path, "99");
  TorchPickleLimits few;
  few.max_tensors = 99;
  EXPECT_EQ(Parse(many, few).status().code(), Status::Code::kInvalidArgument);
  few = {};
  few.max_index_bytes = 1000;  // 100 paths, keys and shapes: 1990 bytes
  EXPECT_EQ(Parse(many, few).status().code(), Status::Code::kInvalidArgument);
}

// A memoized string, list or tuple used again and again costs no more than the opcodes that use
// it: no copy, hash or compare of its contents each time.
TEST(TorchPickleBuiltTest, ReusedValuesDoNotAmplifyWork) {
  const std::string big(1 << 20, 'k');
  std::string pkl = Cat({"\x80\x04", Str(big), "\x94"});  // memo 0
  for (int i = 0; i < 20000; ++i) pkl += "}h\x00Ns0"s;    // {big: None}, dropped
  for (int i = 0; i < 20000; ++i)
    pkl +=
        "h\x00h\x00\x93"
        "0"s;  // the global big.big
  // A list of 1000 pairs (memo 1), then OrderedDict(list) until copying hits the limit.
  pkl += "](";
  for (int i = 0; i < 1000; ++i) pkl += "NN\x86";
  pkl += "e\x94";
  for (int i = 0; i < 5000; ++i) pkl += Global("collections", "OrderedDict") + "h\x01\x85R0";
  Result<TorchPickleIndex> r = Parse(pkl + "N.");
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("copied items"), std::string::npos);

  // Storage keys and locations are short.
  const std::string pid = Cat({"(", Str("storage"), Global("torch", "FloatStorage"),
                               Str(std::string(300, '0')), Str("cpu"), Int(4), "tQ"});
  EXPECT_TRUE(Parse(Pickle(pid)).status().IsCorruption());
}

TEST(TorchPickleBuiltTest, DictKeysFollowPython) {
  // {1: a, True: b, 1.0: c, 'x': d, 'x': e}: one key 1 (its value c), one 'x' (e).
  const std::string t1 = TensorOps(4, 0, Tuple({1}), Tuple({1}));
  const std::string t2 = TensorOps(4, 1, Tuple({1}), Tuple({1}));
  const std::string body = "}(K\x01" + t1 + "\x88" + t1 + "G\x3f\xf0" + std::string(6, '\0') + t2 +
                           Str("x") + t1 + Str("x") + t2 + "u";
  Result<TorchPickleIndex> r = Parse(Pickle(body));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].path, "1");
  EXPECT_EQ(r->tensors[0].storage_offset, 1);
  EXPECT_EQ(r->tensors[1].path, "x");
  EXPECT_EQ(r->tensors[1].storage_offset, 1);
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

TEST(TorchPickleBuiltTest, AWrittenStateDictParsesBack) {
  std::vector<TorchTensorOut> out = {
      {"model.w", DType::kBF16, {3, 4}, "0"},
      {"scalar", DType::kI64, {}, "1"},
      {"huge", DType::kU8, {3, 1ull << 31}, "2"},  // numel past 32 bits: LONG1
  };
  auto pkl = WriteTorchStateDictPickle(out);
  ASSERT_TRUE(pkl.ok()) << pkl.status().ToString();
  auto index = ParseTorchPickle(AsBytes(*pkl));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_EQ(index->tensors.size(), 3u);
  ASSERT_EQ(index->storages.size(), 3u);
  EXPECT_EQ(index->tensors[0].path, "model.w");
  EXPECT_EQ(index->tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(index->tensors[0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(index->tensors[0].stride, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(index->storages[0].numel, 12u);
  EXPECT_TRUE(index->tensors[1].shape.empty());
  EXPECT_EQ(index->tensors[1].storage_key, "1");
  EXPECT_EQ(index->storages[2].numel, 3ull << 31);
  EXPECT_EQ(index->tensors[2].stride, (std::vector<int64_t>{int64_t{1} << 31, 1}));
  EXPECT_TRUE(index->opaque_globals.empty());
}

TEST(TorchPickleBuiltTest, ReportsTheRootDictsScalars) {
  const std::string long_key(TorchPickleIndex::kMaxScalarKeyBytes + 1, 'k');
  const std::string long_text(TorchPickleIndex::kMaxScalarTextBytes + 1, 't');
  // {'epoch': 3, 'pytorch-lightning_version': '2.1.0', 'state_dict': {'w': T}, 'ok': True,
  //  'neg': -5, 'long...': 1, 'note': 'ttt...', 3: 'int key'}
  const std::string body = Cat({"}(",
                                Str("epoch"),
                                Int(3),
                                Str("pytorch-lightning_version"),
                                Str("2.1.0"),
                                Str("state_dict"),
                                "}(",
                                Str("w"),
                                TensorOps(4, 0, Tuple({4}), Tuple({1})),
                                "u",
                                Str("ok"),
                                "\x88",
                                Str("neg"),
                                Int(-5),
                                Str(long_key),
                                Int(1),
                                Str("note"),
                                Str(long_text),
                                Int(3),
                                Str("int key"),
                                "u"});
  auto index = ParseTorchPickle(AsBytes(Pickle(body)));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_EQ(index->tensors.size(), 1u);
  EXPECT_EQ(index->tensors[0].path, "state_dict.w");
  ASSERT_EQ(index->scalars.size(), 4u);
  EXPECT_EQ(index->scalars[0].key, "epoch");
  EXPECT_EQ(index->scalars[0].kind, TorchScalar::Kind::kInt);
  EXPECT_EQ(index->scalars[0].i, 3);
  EXPECT_EQ(index->scalars[1].key, "pytorch-lightning_version");
  EXPECT_EQ(index->scalars[1].kind, TorchScalar::Kind::kString);
  EXPECT_EQ(index->scalars[1].text, "2.1.0");
  EXPECT_EQ(index->scalars[2].key, "ok");
  EXPECT_EQ(index->scalars[2].kind, TorchScalar::Kind::kBool);
  EXPECT_EQ(index->scalars[2].i, 1);
  EXPECT_EQ(index->scalars[3].key, "neg");
  EXPECT_EQ(index->scalars[3].i, -5);
  // A root that is not a dict has none.
  auto list = ParseTorchPickle(AsBytes(Pickle(Cat({"](", Int(1), "e"}))));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_TRUE(list->scalars.empty());
}

}  // namespace
}  // namespace ckptfs
