// Tests of the precision view: a real torch.save file converted to bf16, fp16 and fp32 must be
// a file torch.load opens, with every floating tensor equal to torch's own conversion bitwise
// and tied tensors still sharing storage (checked by views_testdata.py check); safetensors files
// are rewritten likewise; files with nothing to convert or that do not parse are left alone.
#include "engine/views/precision_view.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <random>

#include "engine/views/convert.h"
#include "engine/views/views_test_support.h"

namespace ckptfs {
namespace {

using testing::MemorySource;
using testing::ReadAll;
using testing::ScanLayout;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/precision_view_" + std::to_string(::getpid()) + "_" + name;
}

TEST(PrecisionViewTest, TorchLoadsEachPrecisionBitwise) {
  const std::string orig = TempPath("orig.pt");
  testing::RunTestData("model " + orig + " > /dev/null");
  MemorySource src{testing::ReadWholeFile(orig)};
  const ContentLayout layout = ScanLayout(src.data);
  for (const auto& [name, to] : {std::pair{"bf16", DType::kBF16}, std::pair{"fp16", DType::kF16},
                                 std::pair{"fp32", DType::kF32}}) {
    SCOPED_TRACE(name);
    auto plan = PlanPrecisionView(src.reader(), src.data.size(), layout, to);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const uint64_t planned = (*plan)->size();
    src.bytes_read = 0;
    auto file = (*plan)->Finish(src.reader());
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ((*file)->size(), planned);
    EXPECT_LE(src.bytes_read, 2 * src.data.size());  // one pass for the CRCs, plus headers
    // Finish is computed once.
    auto again = (*plan)->Finish(src.reader());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->get(), file->get());
    const std::string view = TempPath(std::string(name) + ".pt");
    testing::WriteWholeFile(view, ReadAll(**file, src.reader(), 4093));
    const std::string out =
        testing::RunTestData("check " + orig + " " + view + " " + std::string(name));
    EXPECT_EQ(out.substr(0, 3), "ok ") << out;
    std::remove(view.c_str());
  }
  std::remove(orig.c_str());
}

std::string SafetensorsFile(const std::string& json_body, const std::string& data) {
  std::string json = "{" + json_body + "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  const uint64_t len = json.size();
  std::memcpy(file.data(), &len, 8);
  return file + json + data;
}

TEST(PrecisionViewTest, SafetensorsToHalf) {
  std::vector<float> a = {1.0f, -2.5f, 1e-8f, 70000.0f, 0.1f, 3.14159f};
  std::string data(reinterpret_cast<const char*>(a.data()), a.size() * 4);
  for (int64_t i = 0; i < 3; ++i) data.append(reinterpret_cast<const char*>(&i), 8);
  MemorySource src{SafetensorsFile(
      R"("__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("ids":{"dtype":"I64","shape":[3],"data_offsets":[24,48]})",
      data)};
  auto plan = PlanPrecisionView(src.reader(), src.data.size(), ScanLayout(src.data), DType::kF16);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto file = (*plan)->Finish(src.reader());
  ASSERT_TRUE(file.ok());
  const std::string out = ReadAll(**file, src.reader());
  EXPECT_EQ(out.size(), (*plan)->size());
  uint64_t len;
  std::memcpy(&len, out.data(), 8);
  const auto header = nlohmann::json::parse(out.substr(8, len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["w"]["dtype"], "F16");
  EXPECT_EQ(header["w"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(header["ids"]["dtype"], "I64");
  EXPECT_EQ(header["ids"]["data_offsets"], nlohmann::json::array({12, 36}));
  ASSERT_EQ(out.size(), 8 + len + 36);
  for (size_t i = 0; i < a.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, out.data() + 8 + len + 2 * i, 2);
    EXPECT_EQ(h, Fp32ToFp16(a[i])) << i;
  }
  EXPECT_EQ(out.substr(8 + len + 12), data.substr(24));
}

// The rewritten header of a file of many tensors, whose names need escaping: exactly the JSON
// that dumping one ordered object gives (the header is written member by member, so that its
// cost grows with the number of tensors, not with its square).
TEST(PrecisionViewTest, SafetensorsHeaderOfManyTensors) {
  constexpr int kTensors = 5000;
  std::string body = R"("__metadata__":{"format":"pt","z":"\"quoted\""},)";
  std::string data;
  nlohmann::ordered_json expect = nlohmann::ordered_json::object();
  expect["__metadata__"] = {{"format", "pt"}, {"z", "\"quoted\""}};
  uint64_t in = 0, out = 0;
  for (int i = 0; i < kTensors; ++i) {
    // Names sorted as their data is laid out, with quotes, backslashes, a tab and UTF-8.
    char name[64];
    std::snprintf(name, sizeof(name), "layer.%05d.w\"\\\t\xc3\xa9", i);
    const bool f32 = i % 3 != 0;
    const uint64_t bytes = f32 ? 8 : 2;  // two f32, or one i16 (left as it is)
    body += nlohmann::json(name).dump() + ":{\"dtype\":\"" + (f32 ? "F32" : "I16") +
            "\",\"shape\":[" + (f32 ? "2" : "1") + "],\"data_offsets\":[" + std::to_string(in) +
            "," + std::to_string(in + bytes) + "]},";
    in += bytes;
    data.append(bytes, static_cast<char>(i));
    const uint64_t out_bytes = f32 ? 4 : 2;
    expect[name] = {{"dtype", f32 ? "BF16" : "I16"},
                    {"shape", std::vector<uint64_t>{f32 ? 2u : 1u}},
                    {"data_offsets", {out, out + out_bytes}}};
    out += out_bytes;
  }
  body.pop_back();
  MemorySource src{SafetensorsFile(body, data)};
  auto plan = PlanPrecisionView(src.reader(), src.data.size(), ScanLayout(src.data), DType::kBF16);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto file = (*plan)->Finish(src.reader());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::string view = ReadAll(**file, src.reader());
  uint64_t len;
  ASSERT_GE(view.size(), 8u);
  std::memcpy(&len, view.data(), 8);
  ASSERT_LE(8 + len, view.size());
  std::string header = expect.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(view.substr(8, len), header);
  EXPECT_EQ(view.size(), 8 + len + out);
}

TEST(PrecisionViewTest, NothingToConvertOrUnparsable) {
  std::string ids(24, '\x01');
  MemorySource ints{
      SafetensorsFile(R"("ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]})", ids)};
  auto plan =
      PlanPrecisionView(ints.reader(), ints.data.size(), ScanLayout(ints.data), DType::kBF16);
  EXPECT_EQ(plan.status().code(), Status::Code::kNotSupported);
  MemorySource text{std::string(5000, 'z')};
  plan = PlanPrecisionView(text.reader(), text.data.size(), ScanLayout(text.data), DType::kBF16);
  EXPECT_EQ(plan.status().code(), Status::Code::kNotSupported);
}

TEST(PrecisionViewTest, RewriterNamesTheNewStorageType) {
  // protocol 2, as torch.save writes it: GLOBAL 'torch FloatStorage' inside the persistent id.
  const std::string pkl = std::string("\x80\x02") + "ctorch\nFloatStorage\nq\x01" +
                          "ctorch\nLongStorage\nq\x02" + "ctorch\nHalfStorage\n.";
  auto out =
      RewriteTorchPickle(pkl, DType::kBF16, [](DType d) { return ConvertsTo(d, DType::kBF16); });
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, std::string("\x80\x02") + "ctorch\nBFloat16Storage\nq\x01" +
                      "ctorch\nLongStorage\nq\x02" + "ctorch\nBFloat16Storage\n.");
  // Protocol 4: STACK_GLOBAL of two pushed strings, framing dropped.
  const std::string p4 = std::string("\x80\x04\x95\x20\0\0\0\0\0\0\0", 11) +
                         "\x8c\x05torch\x94\x8c\x0c"
                         "FloatStorage\x94\x93\x94.";
  out = RewriteTorchPickle(p4, DType::kF16, [](DType d) { return ConvertsTo(d, DType::kF16); });
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "\x80\x04\x8c\x05torch\x94\x8c\x0bHalfStorage\x94\x93\x94.");
}

TEST(PrecisionViewTest, RewriterRejectsGarbageWithoutCrashing) {
  const auto all = [](DType) { return true; };
  EXPECT_FALSE(RewriteTorchPickle("", DType::kBF16, all).ok());
  EXPECT_FALSE(RewriteTorchPickle("pnot-a-number\n.", DType::kBF16, all).ok());
  EXPECT_FALSE(RewriteTorchPickle("p99999999999999999999999\n.", DType::kBF16, all).ok());
  EXPECT_FALSE(RewriteTorchPickle("\x8c\xff", DType::kBF16, all).ok());
  EXPECT_FALSE(RewriteTorchPickle("ctorch\nFloatStorage", DType::kBF16, all).ok());
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    (void)RewriteTorchPickle(junk, DType::kBF16, all);  // must return, whatever it returns
  }
}

}  // namespace
}  // namespace ckptfs
