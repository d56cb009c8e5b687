// Tests of the per-tensor view on a real torch.save file (views_testdata.py model: tied
// weights, offset and strided views into shared storages, fp16/bf16/fp64/int/bool, 0-d and
// empty tensors, Adam state) and on safetensors files; every .npy's data must equal the bytes
// torch gives for the tensor, in C order.
#include "engine/views/tensor_view.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/views/convert.h"
#include "engine/views/views_test_support.h"

namespace ckptfs {
namespace {

using testing::MemorySource;
using testing::ReadAll;
using testing::ScanLayout;

struct Expected {
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string bytes;
};

// Saves views_testdata.py's sample checkpoint; returns the file and what torch.load gives.
std::string SampleCheckpoint(std::map<std::string, Expected>* expected) {
  const std::string path =
      ::testing::TempDir() + "/tensor_view_" + std::to_string(::getpid()) + ".pt";
  std::istringstream lines(testing::RunTestData("model " + path));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string name, dtype, shape, hex;
    in >> name >> dtype >> shape >> hex;
    Expected e{dtype, {}, testing::Unhex(hex)};
    if (shape != "-") {
      std::istringstream dims(shape);
      for (std::string d; std::getline(dims, d, ',');) e.shape.push_back(std::stoull(d));
    }
    (*expected)[name] = std::move(e);
  }
  std::string file = testing::ReadWholeFile(path);
  std::remove(path.c_str());
  return file;
}

std::string NpyData(const TensorView::Entry& e, const SourceReader& read) {
  const std::string npy = ReadAll(e.npy, read);
  return npy.substr(NpyHeader(e.dtype, e.shape).size());
}

TEST(TensorViewTest, NpyHeader) {
  for (const auto& shape : {std::vector<uint64_t>{}, {3}, {2, 3}, {0, 4}}) {
    const std::string h = NpyHeader(DType::kF32, shape);
    EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    EXPECT_EQ(h.size() % 64, 0u);
    EXPECT_EQ(h.back(), '\n');
    EXPECT_EQ(static_cast<uint8_t>(h[8]) | static_cast<uint8_t>(h[9]) << 8, h.size() - 10);
  }
  EXPECT_NE(NpyHeader(DType::kF32, {}).find("'shape': ()"), std::string::npos);
  EXPECT_NE(NpyHeader(DType::kF32, {3}).find("'shape': (3,)"), std::string::npos);
  EXPECT_NE(NpyHeader(DType::kI64, {2, 3}).find("'descr': '<i8'"), std::string::npos);
  EXPECT_NE(NpyHeader(DType::kF16, {2, 3}).find("'shape': (2, 3)"), std::string::npos);
  EXPECT_NE(NpyHeader(DType::kBF16, {1}).find("'descr': '<u2'"), std::string::npos);
}

TEST(TensorViewTest, EscapesNames) {
  EXPECT_EQ(EscapeTensorName("module.layers.3.attn.q.weight"), "module.layers.3.attn.q.weight");
  EXPECT_EQ(EscapeTensorName("a/b%c"), "a%2Fb%25c");
  EXPECT_EQ(EscapeTensorName(""), "tensor");
  EXPECT_EQ(EscapeTensorName("index.json"), "%index.json");
  EXPECT_EQ(EscapeTensorName(".."), "%..");
}

TEST(TensorViewTest, EveryTorchTensorEqualsTorch) {
  std::map<std::string, Expected> expected;
  MemorySource src{SampleCheckpoint(&expected)};
  ASSERT_GT(expected.size(), 15u);
  const ContentLayout layout = ScanLayout(src.data);
  ASSERT_EQ(layout.format, ContentLayout::Format::kTorchZip);
  auto view = BuildTensorView(src.reader(), src.data.size(), layout, std::nullopt);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ((*view)->format, ContentLayout::Format::kTorchZip);
  ASSERT_EQ((*view)->tensors.size(), expected.size());
  for (const TensorView::Entry& e : (*view)->tensors) {
    SCOPED_TRACE(e.name);
    auto it = expected.find(e.name);
    ASSERT_NE(it, expected.end());
    EXPECT_EQ(DTypeName(e.dtype), it->second.dtype);
    EXPECT_EQ(e.shape, it->second.shape);
    EXPECT_EQ((*view)->Find(e.file), &e.npy);
    EXPECT_EQ(NpyData(e, src.reader()), it->second.bytes);
    // Read in odd pieces, the same bytes.
    EXPECT_EQ(ReadAll(e.npy, src.reader(), 7), ReadAll(e.npy, src.reader()));
  }
  // What it holds is small: the index and a few hundred bytes per tensor, no tensor data.
  const std::string index_text = ReadAll((*view)->index, src.reader());
  EXPECT_GT((*view)->memory_bytes(), index_text.size());
  EXPECT_LT((*view)->memory_bytes(), index_text.size() + 1024 * expected.size());
  // index.json lists them all.
  const auto index = nlohmann::json::parse(index_text);
  EXPECT_EQ(index["format"], "torch");
  ASSERT_EQ(index["tensors"].size(), expected.size());
  for (const auto& t : index["tensors"]) {
    const Expected& e = expected.at(t["name"].get<std::string>());
    EXPECT_EQ(t["dtype"], e.dtype);
    EXPECT_EQ(t["bytes"], e.bytes.size());
    EXPECT_EQ(t["shape"].get<std::vector<uint64_t>>(), e.shape);
  }
}

TEST(TensorViewTest, ReadingOneTensorReadsOnlyItsBytes) {
  std::map<std::string, Expected> expected;
  MemorySource src{SampleCheckpoint(&expected)};
  auto view = BuildTensorView(src.reader(), src.data.size(), ScanLayout(src.data), std::nullopt);
  ASSERT_TRUE(view.ok());
  for (const char* name : {"module.slice", "module.embed.weight", "optimizer.state.0.exp_avg"}) {
    const TensorView::Entry& e = (*view)->tensors[(*view)->by_file.at(std::string(name) + ".npy")];
    src.bytes_read = 0;
    EXPECT_EQ(NpyData(e, src.reader()), expected.at(name).bytes);
    EXPECT_EQ(src.bytes_read, expected.at(name).bytes.size()) << name;
    uint64_t ranges = 0;
    e.npy.SourceRanges(0, e.npy.size(), [&](uint64_t, uint64_t len) { ranges += len; });
    EXPECT_EQ(ranges, expected.at(name).bytes.size()) << name;
  }
}

TEST(TensorViewTest, ConvertedToBfloat16) {
  std::map<std::string, Expected> expected;
  MemorySource src{SampleCheckpoint(&expected)};
  auto view = BuildTensorView(src.reader(), src.data.size(), ScanLayout(src.data), DType::kBF16);
  ASSERT_TRUE(view.ok());
  for (const TensorView::Entry& e : (*view)->tensors) {
    SCOPED_TRACE(e.name);
    const Expected& want = expected.at(e.name);
    const std::optional<DType> orig = DTypeFromName(want.dtype);
    ASSERT_TRUE(orig);
    if (!ConvertsTo(*orig, DType::kBF16)) {
      EXPECT_EQ(e.dtype, *orig);
      EXPECT_EQ(NpyData(e, src.reader()), want.bytes);
      continue;
    }
    EXPECT_EQ(e.dtype, DType::kBF16);
    const size_t n = want.bytes.size() / ElementSize(*orig);
    std::string converted(2 * n, '\0');
    ConvertElements(*orig, DType::kBF16, reinterpret_cast<const std::byte*>(want.bytes.data()), n,
                    reinterpret_cast<std::byte*>(converted.data()));
    EXPECT_EQ(NpyData(e, src.reader()), converted);
  }
}

TEST(TensorViewTest, Safetensors) {
  // a: f32 [2,3], b/c: i64 [4], d: bf16 [3]
  std::string data;
  for (int i = 0; i < 6; ++i) {
    const float f = static_cast<float>(i) + 0.5f;
    data.append(reinterpret_cast<const char*>(&f), 4);
  }
  for (int64_t i = 0; i < 4; ++i) data.append(reinterpret_cast<const char*>(&i), 8);
  data.append("\x80\x3f\x00\x40\x40\x40", 6);
  std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b/c":{"dtype":"I64","shape":[4],"data_offsets":[24,56]},)"
      R"("d":{"dtype":"BF16","shape":[3],"data_offsets":[56,62]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  const uint64_t len = json.size();
  std::memcpy(file.data(), &len, 8);
  MemorySource src{file + json + data};
  const ContentLayout layout = ScanLayout(src.data);
  EXPECT_EQ(layout.format, ContentLayout::Format::kSafetensors);
  auto view = BuildTensorView(src.reader(), src.data.size(), layout, std::nullopt);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_EQ((*view)->tensors.size(), 3u);
  const TensorView& v = **view;
  EXPECT_EQ(v.tensors[0].name, "a");
  EXPECT_EQ(v.tensors[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(NpyData(v.tensors[0], src.reader()), data.substr(0, 24));
  EXPECT_EQ(v.tensors[1].file, "b%2Fc.npy");
  EXPECT_EQ(NpyData(v.tensors[1], src.reader()), data.substr(24, 32));
  EXPECT_EQ(v.tensors[2].dtype, DType::kBF16);
  EXPECT_EQ(NpyData(v.tensors[2], src.reader()), data.substr(56, 6));
  const auto index = nlohmann::json::parse(ReadAll(v.index, src.reader()));
  EXPECT_EQ(index["format"], "safetensors");
  EXPECT_EQ(index["tensors"][2]["dtype"], "bfloat16");
}

TEST(TensorViewTest, GarbageHasNoView) {
  std::map<std::string, Expected> expected;
  std::string file = SampleCheckpoint(&expected);
  const ContentLayout layout = ScanLayout(file);
  // The same archive with its pickle overwritten by garbage of the same length.
  const LayoutSection* pkl = nullptr;
  for (const LayoutSection& s : layout.sections) {
    if (SectionKey(s.name) == "data.pkl") pkl = &s;
  }
  ASSERT_NE(pkl, nullptr);
  for (uint64_t i = 0; i < pkl->size; ++i)
    file[pkl->start + i] = static_cast<char>("garbage"[i % 7]);
  MemorySource src{file};
  auto view = BuildTensorView(src.reader(), file.size(), ScanLayout(file), std::nullopt);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), Status::Code::kNotSupported) << view.status().ToString();
  // Not a checkpoint at all.
  MemorySource text{std::string(1000, 'x')};
  auto none = BuildTensorView(text.reader(), 1000, ScanLayout(text.data), std::nullopt);
  EXPECT_EQ(none.status().code(), Status::Code::kNotSupported);
}

}  // namespace
}  // namespace ckptfs
