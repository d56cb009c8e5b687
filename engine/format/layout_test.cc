#include "engine/format/layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace ckptfs {
namespace {

// A safetensors file: 8-byte header length, JSON, then the tensors' bytes.
std::string Safetensors(const std::vector<std::pair<std::string, size_t>>& f32_tensors,
                        uint32_t seed = 1) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t at = 0;
  for (const auto& [name, n] : f32_tensors) {
    json += ",\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) +
            "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + 4 * n) + "]}";
    at += 4 * n;
  }
  json += "}";
  std::string file(8, '\0');
  const uint64_t len = json.size();
  std::memcpy(file.data(), &len, 8);
  file += json;
  std::mt19937 rng(seed);
  for (size_t i = 0; i < at; ++i) file.push_back(static_cast<char>(rng()));
  return file;
}

struct Scanned {
  std::vector<uint64_t> boundaries;
  ContentLayout layout;
  std::optional<uint64_t> signature;  // as soon as the scanner knew it
  uint64_t signature_at = 0;          // bytes scanned by then
};

// Feeds `file` in pieces of the given sizes (cycled) and records every boundary.
Scanned Scan(const std::string& file, std::vector<size_t> pieces) {
  LayoutScanner scanner;
  Scanned out;
  uint64_t consumed = 0;
  Bytes rest = AsBytes(file);
  size_t i = 0;
  while (!rest.empty()) {
    Bytes piece = rest.first(std::min(rest.size(), pieces[i++ % pieces.size()]));
    rest = rest.subspan(piece.size());
    while (!piece.empty() || scanner.AtBoundary()) {
      const size_t n = piece.empty() ? 0 : scanner.Scan(piece);
      consumed += n;
      if (!out.signature && scanner.signature()) {
        out.signature = scanner.signature();
        out.signature_at = consumed;
      }
      if (scanner.AtBoundary()) out.boundaries.push_back(scanner.boundary());
      piece = piece.subspan(n);
      if (n == 0 && !scanner.AtBoundary()) break;
      if (piece.empty()) break;
    }
  }
  out.layout = scanner.TakeLayout();
  return out;
}

TEST(LayoutScannerTest, SafetensorsTensorsAreSectionsWhateverTheSplits) {
  const std::string file = Safetensors({{"a", 1000}, {"b.weight", 1}, {"c", 70000}});
  const uint64_t data = file.size() - 4 * 71001;
  for (std::vector<size_t> pieces :
       {std::vector<size_t>{1}, {7, 3}, {4096}, {file.size()}, {100000, 5}}) {
    Scanned s = Scan(file, pieces);
    ASSERT_EQ(s.layout.format, ContentLayout::Format::kSafetensors);
    ASSERT_EQ(s.layout.sections.size(), 3u);
    EXPECT_EQ(s.layout.sections[0].name, "a");
    EXPECT_EQ(s.layout.sections[0].start, data);
    EXPECT_EQ(s.layout.sections[0].size, 4000u);
    EXPECT_EQ(s.layout.sections[1].start, data + 4000);
    EXPECT_EQ(s.layout.sections[2].size, 280000u);
    EXPECT_EQ(s.layout.sections[2].dtype, DType::kF32);
    EXPECT_EQ(s.layout.sections[2].width(), 4);
    // The last tensor's end is the file's: no bytes come after it to report it at.
    std::vector<uint64_t> expected = {data, data + 4000, data + 4004};
    EXPECT_EQ(s.boundaries, expected);
  }
}

TEST(LayoutScannerTest, SignatureNamesTheTensorsNotTheirValuesAndIsKnownBeforeThem) {
  const std::string a = Safetensors({{"w", 1000}, {"b", 10}}, 1);
  const std::string a2 = Safetensors({{"w", 1000}, {"b", 10}}, 2);   // other values
  const std::string c = Safetensors({{"w", 1001}, {"b", 10}}, 1);    // another shape
  const std::string d = Safetensors({{"w2", 1000}, {"b", 10}}, 1);   // another name
  Scanned sa = Scan(a, {7}), sa2 = Scan(a2, {a2.size()}), sc = Scan(c, {4096}), sd = Scan(d, {1});
  ASSERT_TRUE(sa.signature);
  EXPECT_EQ(sa.signature, sa2.signature);
  EXPECT_NE(sa.signature, sc.signature);
  EXPECT_NE(sa.signature, sd.signature);
  // Known before the first tensor's bytes, and what the stored layout gives.
  EXPECT_LE(sa.signature_at, sa.layout.sections[0].start);
  EXPECT_EQ(LayoutSignature(sa.layout), sa.signature);
  EXPECT_EQ(LayoutSignature(sc.layout), sc.signature);
  // A layout without typed sections has none.
  EXPECT_FALSE(LayoutSignature(ContentLayout{}));
  EXPECT_FALSE(Scan(std::string("no format at all"), {3}).signature);
}

TEST(LayoutScannerTest, NotAFormatHasNoSections) {
  for (std::string file : {std::string("hello world, this is text"), std::string(3, 'P'),
                           std::string("PK\x01\x02 central directory first"),
                           std::string("\x10\0\0\0\0\0\0\0{\"a\":1}xxxxxxxxxxxxx", 28)}) {
    Scanned s = Scan(file, {5});
    EXPECT_TRUE(s.boundaries.empty());
    EXPECT_TRUE(s.layout.sections.empty());
  }
}

// Found by the views fuzzer: a header one byte long is complete once the 9 bytes that detect
// the format are in, and must not leave a call that consumed nothing without a boundary.
TEST(LayoutScannerTest, AOneByteSafetensorsHeaderIsConsumedWithoutAStall) {
  const std::string file("\x01\0\0\0\0\0\0\0{ rest of the file", 26);
  LayoutScanner scanner;
  Bytes rest = AsBytes(file);
  while (!rest.empty()) {
    const size_t n = scanner.Scan(rest);
    ASSERT_TRUE(n > 0 || scanner.AtBoundary());
    rest = rest.subspan(n);
  }
  EXPECT_TRUE(scanner.TakeLayout().sections.empty());
}

TEST(LayoutScannerTest, LayoutRowsRoundTripAndRejectGarbage) {
  ContentLayout layout;
  layout.format = ContentLayout::Format::kTorchZip;
  layout.sections.push_back({"m/data.pkl", 64, 900, std::nullopt});
  layout.sections.push_back({"m/data/0", 1024, 4096, DType::kBF16});
  const std::string row = layout.Encode();
  auto back = ContentLayout::Decode(row);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->sections.size(), 2u);
  EXPECT_EQ(back->sections[1].name, "m/data/0");
  EXPECT_EQ(back->sections[1].dtype, DType::kBF16);
  EXPECT_FALSE(back->sections[0].dtype.has_value());
  EXPECT_EQ(back->Find("m/data/0")->start, 1024u);
  EXPECT_EQ(SectionKey("m/data/0"), "data/0");
  for (size_t cut = 0; cut < row.size(); ++cut) {
    EXPECT_FALSE(ContentLayout::Decode(row.substr(0, cut)).ok()) << cut;
  }
}

}  // namespace
}  // namespace ckptfs
