// Criterion 3: a damaged record reads as Status::Corruption, never as wrong bytes; everything
// else still reads; Verify() and `ckptfs verify` name the pack file and offset of the damage.
#include <fcntl.h>
#include <unistd.h>

#include "engine/store/record.h"
#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kMiB = 1u << 20;

enum class Data { kRandom, kCompressible };
enum class Flip { kPayload, kHeader };
void PrintTo(Data data, std::ostream* os) { *os << (data == Data::kRandom ? "raw" : "lz4"); }
void PrintTo(Flip flip, std::ostream* os) {
  *os << (flip == Flip::kPayload ? "payload" : "header");
}

// Bytes that lz4 shrinks: every 64-byte block starts with 16 random bytes, then zeros.
std::vector<std::byte> CompressibleBytes(uint64_t seed, size_t size) {
  std::vector<std::byte> data(size);
  for (size_t block = 0; block < size; block += 64) {
    FillPattern(seed, block, MutableBytes(data).subspan(block, std::min<size_t>(16, size - block)));
  }
  return data;
}

void FlipByte(const std::filesystem::path& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  std::byte b;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= std::byte{0x10};
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

class CorruptionTest : public ::testing::TestWithParam<std::tuple<Data, Flip>> {};

TEST_P(CorruptionTest, DamagedRecordIsReportedNeverReadAsBytes) {
  const auto [kind, flip] = GetParam();
  TempDir dir("corruption");
  const std::vector<std::byte> damaged_src =
      kind == Data::kRandom ? PatternBytes(1, 0, 12 * kMiB) : CompressibleBytes(1, 12 * kMiB);
  const std::vector<std::byte> other_src = PatternBytes(2, 0, 6 * kMiB);
  ContentId damaged = 0, other = 0;
  RecordPlace place;
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(damaged, WriteContent(*store, damaged_src));
    ASSERT_OK_AND_ASSIGN(other, WriteContent(*store, other_src));
    store->WaitReencoded();  // the records as kept: compressed behind the writer
    ASSERT_OK_AND_ASSIGN(place, PlaceOfChunk(*store, damaged, 3));
    EXPECT_EQ(place.row.codec, kind == Data::kRandom ? Codec::kNone : Codec::kLz4);
    ASSERT_TRUE(VerifyClean(*store));
  }
  const std::string pack_name = PackFileName(place.row.pack_id);
  const uint64_t payload_bytes = place.row.length - kRecordHeaderBytes;
  const uint64_t at = flip == Flip::kPayload
                          ? place.row.offset + kRecordHeaderBytes + payload_bytes / 2
                          : place.row.offset + 10;  // the raw length field
  FlipByte(dir.path() / "packs" / pack_name, at);

  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store);
    // The damaged chunk, a read that runs into it, and the whole content all fail.
    const uint64_t start = place.ref.offset, len = place.ref.length;
    std::vector<std::byte> buf(len + 4096);
    for (auto [offset, n] : {std::pair{start, len}, std::pair{start + len / 3, uint64_t{1}},
                             std::pair{start - 4096, len + 4096}}) {
      auto r = store->Read(damaged, offset, MutableBytes(buf).first(n));
      ASSERT_FALSE(r.ok()) << "read " << n << " bytes at " << offset << " returned " << *r;
      EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
      EXPECT_NE(r.status().message().find(pack_name), std::string::npos) << r.status().ToString();
    }
    auto whole = ReadContent(*store, damaged);
    ASSERT_FALSE(whole.ok());
    EXPECT_TRUE(whole.status().IsCorruption()) << whole.status().ToString();

    // Other chunks of the same content and other contents still read.
    std::vector<std::byte> head(place.ref.offset);
    ASSERT_OK_AND_ASSIGN(size_t got, store->Read(damaged, 0, MutableBytes(head)));
    EXPECT_EQ(got, head.size());
    EXPECT_TRUE(BytesEqual(Bytes(damaged_src).first(head.size()), head));
    const uint64_t after = start + len;
    std::vector<std::byte> tail(damaged_src.size() - after);
    ASSERT_OK_AND_ASSIGN(got, store->Read(damaged, after, MutableBytes(tail)));
    EXPECT_EQ(got, tail.size());
    EXPECT_TRUE(BytesEqual(Bytes(damaged_src).subspan(after), tail));
    EXPECT_TRUE(ContentEquals(*store, other, other_src));

    ASSERT_OK_AND_ASSIGN(VerifyReport report, store->Verify());
    ASSERT_EQ(report.problems.size(), 1u) << ::testing::PrintToString(report.problems);
    const std::string& problem = report.problems[0];
    EXPECT_NE(problem.find(pack_name), std::string::npos) << problem;
    EXPECT_NE(problem.find("offset " + std::to_string(place.row.offset)), std::string::npos)
        << problem;
  }

  // The CLI, on the closed store (it takes the store's lock).
  ProcessResult cli = RunProcess({CKPTFS_BINARY, "verify", dir.path().string()});
  EXPECT_EQ(cli.exit_code, 1) << cli.out << cli.err;
  EXPECT_NE(cli.out.find(pack_name), std::string::npos) << cli.out;
  EXPECT_NE(cli.out.find("offset " + std::to_string(place.row.offset)), std::string::npos)
      << cli.out;
}

INSTANTIATE_TEST_SUITE_P(Records, CorruptionTest,
                         ::testing::Combine(::testing::Values(Data::kRandom, Data::kCompressible),
                                            ::testing::Values(Flip::kPayload, Flip::kHeader)),
                         [](const ::testing::TestParamInfo<CorruptionTest::ParamType>& info) {
                           return std::string(std::get<0>(info.param) == Data::kRandom ? "Raw"
                                                                                       : "Lz4") +
                                  (std::get<1>(info.param) == Flip::kPayload ? "Payload"
                                                                             : "Header");
                         });

}  // namespace
}  // namespace ckptfs::testing
