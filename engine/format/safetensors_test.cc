// Tests of ParseSafetensorsHeader on files laid out as safetensors' save_file lays them out
// (engine/format/safetensors_testdata.py), and on hand-built headers, malformed ones included.
#include "engine/format/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ckptfs {
namespace {

namespace fs = std::filesystem;

const std::string kTestData =
    std::string(CKPTFS_SOURCE_DIR) + "/engine/format/safetensors_testdata.py";

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> Describe(const SafetensorsIndex& index) {
  std::vector<std::string> lines;
  for (const SafetensorsTensor& t : index.tensors) {
    std::string dims;
    for (uint64_t d : t.shape) {
      if (!dims.empty()) dims += ',';
      dims += std::to_string(d);
    }
    lines.push_back("T\t" + t.name + "\t" + std::string(SafetensorsName(t.dtype)) + "\t" +
                    (dims.empty() ? "-" : dims) + "\t" + std::to_string(t.begin) + "\t" +
                    std::to_string(t.end));
  }
  for (const auto& [k, v] : index.metadata) lines.push_back("M\t" + k + "\t" + v);
  return lines;
}

// A file: the 8-byte length, the header, and (as the parser ignores it) no data.
std::string File(const std::string& header) {
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header;
}
Result<SafetensorsIndex> Parse(const std::string& header) {
  const std::string file = File(header);
  return ParseSafetensorsHeader(AsBytes(file));
}

TEST(SafetensorsTest, ReadsFilesAsSaveFileWritesThem) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const fs::path dir =
      fs::temp_directory_path() / ("ckptfs_safetensors_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + kTestData + " write " + dir.string();
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[256];
  std::string out;
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << cmd;
  const std::vector<std::string> names = Lines(out);
  ASSERT_EQ(names.size(), 4u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const std::string file = ReadText(dir / (name + ".safetensors"));
    Result<size_t> need = SafetensorsHeaderBytes(AsBytes(file).first(8));
    ASSERT_TRUE(need.ok());
    EXPECT_EQ(SafetensorsHeaderBytes(AsBytes(file).first(3)).value(), 8u);
    EXPECT_EQ(*need % 8, 0u);  // padded
    // The header alone is enough; so is the whole file.
    for (Bytes prefix : {AsBytes(file).first(*need), AsBytes(file)}) {
      Result<SafetensorsIndex> index = ParseSafetensorsHeader(prefix);
      ASSERT_TRUE(index.ok()) << index.status().ToString();
      EXPECT_EQ(Describe(*index), Lines(ReadText(dir / (name + ".txt"))));
      EXPECT_EQ(index->data_begin, *need);
      EXPECT_EQ(index->data_end, file.size());
    }
    ASSERT_FALSE(ParseSafetensorsHeader(AsBytes(file).first(*need - 1)).ok());
  }
  fs::remove_all(dir);
}

TEST(SafetensorsTest, ReadsHandBuiltHeaders) {
  Result<SafetensorsIndex> r =
      Parse(R"({"b":{"dtype":"F16","shape":[2,3],"data_offsets":[4,16]},)"
            R"("a":{"dtype":"I32","shape":[],"data_offsets":[0,4],"extra":{"x":[1,[2,{}]]}},)"
            R"("__metadata__":null}   )");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 2u);
  const uint64_t base = r->data_begin;
  EXPECT_EQ(r->tensors[0].name, "a");
  EXPECT_EQ(r->tensors[0].dtype, DType::kI32);
  EXPECT_EQ(r->tensors[0].begin, base);
  EXPECT_EQ(r->tensors[1].name, "b");
  EXPECT_EQ(r->tensors[1].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(r->tensors[1].end, base + 16);
  EXPECT_EQ(r->data_end, base + 16);
  EXPECT_TRUE(r->metadata.empty());

  r = Parse(R"({})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data_end, r->data_begin);
}

TEST(SafetensorsTest, RejectsMalformedHeaders) {
  const std::string t = R"("dtype":"F32","shape":[2],"data_offsets":)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"not an object", "[]"},
      {"leading space", R"( {})"},
      {"not JSON", R"({"a":)"},
      {"trailing garbage", R"({} x)"},
      {"two values", R"({}{})"},
      {"invalid UTF-8", "{\"\xff\":{}}"},
      {"tensor not an object", R"({"a":[1]})"},
      {"unknown dtype", R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})"},
      {"dtype not a string", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})"},
      {"negative shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"},
      {"float shape", R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})"},
      {"nested shape", R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})"},
      {"shape not an array", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})"},
      {"three offsets", "{\"a\":{" + t + "[0,8,8]}}"},
      {"one offset", "{\"a\":{" + t + "[0]}}"},
      {"no dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})"},
      {"no shape", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})"},
      {"no offsets", R"({"a":{"dtype":"F32","shape":[2]}})"},
      {"field twice", R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})"},
      {"size mismatch", "{\"a\":{" + t + "[0,9]}}"},
      {"end before begin", "{\"a\":{" + t + "[8,0]}}"},
      {"not at 0", "{\"a\":{" + t + "[1,9]}}"},
      {"gap", "{\"a\":{" + t + "[0,8]},\"b\":{" + t + "[9,17]}}"},
      {"overlap", "{\"a\":{" + t + "[0,8]},\"b\":{" + t + "[4,12]}}"},
      {"same range", "{\"a\":{" + t + "[0,8]},\"b\":{" + t + "[0,8]}}"},
      {"name twice", "{\"a\":{" + t + "[0,8]},\"a\":{" + t + "[8,16]}}"},
      {"metadata not strings", R"({"__metadata__":{"a":1}})"},
      {"metadata not an object", R"({"__metadata__":"x"})"},
      {"metadata twice", R"({"__metadata__":{},"__metadata__":{}})"},
      {"offset overflow",
       R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}})"},
      {"shape overflow",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"},
      {"unbalanced deep nesting", "{\"a\":{\"x\":" + std::string(100000, '[') + "}}"},
  };
  for (const auto& [what, header] : cases) {
    Result<SafetensorsIndex> r = Parse(header);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_TRUE(r.status().IsCorruption()) << what << ": " << r.status().ToString();
  }
  // Deep nesting in an ignored member is read in constant memory per level.
  const std::string deep =
      "{\"a\":{" + t + "[0,8],\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}}";
  EXPECT_TRUE(Parse(deep).ok());
}

TEST(SafetensorsTest, ChecksTheHeaderLength) {
  const std::string ok = File("{}");
  EXPECT_EQ(SafetensorsHeaderBytes(AsBytes(ok)).value(), 10u);
  EXPECT_EQ(SafetensorsHeaderBytes(AsBytes(ok).first(7)).value(), 8u);
  Result<SafetensorsIndex> r = ParseSafetensorsHeader(AsBytes(ok).first(9));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption());
  EXPECT_FALSE(ParseSafetensorsHeader(AsBytes(ok).first(5)).ok());

  uint64_t huge = kMaxSafetensorsHeaderBytes + 1;
  std::string big(reinterpret_cast<const char*>(&huge), 8);
  EXPECT_TRUE(SafetensorsHeaderBytes(AsBytes(big)).status().IsCorruption());
  huge = ~uint64_t{0};
  big.assign(reinterpret_cast<const char*>(&huge), 8);
  EXPECT_TRUE(ParseSafetensorsHeader(AsBytes(big)).status().IsCorruption());
}

}  // namespace
}  // namespace ckptfs
