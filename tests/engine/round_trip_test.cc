// Criterion 1: every content reads back bitwise, whole and at random offsets, for sizes around
// the chunker's boundaries and up to 100 MiB, for random, zero-filled and real torch.save bytes.
#include <string>
#include <vector>

#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kMiB = 1u << 20;

// The sizes every kind of content is tried at.
std::vector<size_t> EdgeSizes() {
  const FastCdc::Params p = StoreOptions{}.chunking;
  return {0,
          1,
          p.min_size - 1,
          p.min_size + 1,
          p.avg_size - 1,
          p.avg_size + 1,
          p.max_size - 1,
          p.max_size + 1,
          100 * kMiB};
}

// Writes data to a fresh store in dir, checks it before and after reopening the store (so
// that the second pass reads from the pack files), and that Verify finds nothing.
void CheckRoundTrip(const std::filesystem::path& dir, Bytes data, uint64_t seed) {
  ContentId id = 0;
  {
    auto store = OpenStore(dir);
    ASSERT_TRUE(store);
    ASSERT_OK_AND_ASSIGN(id, WriteContent(*store, data, seed));
    EXPECT_TRUE(ContentEquals(*store, id, data));
    EXPECT_TRUE(RandomReadsMatch(*store, id, data, seed));
  }
  auto store = OpenStore(dir);
  ASSERT_TRUE(store);
  ASSERT_OK_AND_ASSIGN(ContentRow row, store->StatContent(id));
  EXPECT_EQ(row.size, data.size());
  EXPECT_TRUE(ContentEquals(*store, id, data));
  EXPECT_TRUE(RandomReadsMatch(*store, id, data, seed + 1));
  EXPECT_TRUE(VerifyClean(*store));
}

enum class Fill { kRandom, kZeros };
void PrintTo(Fill fill, std::ostream* os) { *os << (fill == Fill::kRandom ? "random" : "zeros"); }

class RoundTripTest : public ::testing::TestWithParam<std::tuple<Fill, size_t>> {};

TEST_P(RoundTripTest, ReadsBackBitwise) {
  const auto [fill, size] = GetParam();
  std::vector<std::byte> data =
      fill == Fill::kRandom ? PatternBytes(size, 0, size) : std::vector<std::byte>(size);
  TempDir dir("roundtrip");
  CheckRoundTrip(dir.path(), data, size + 11);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RoundTripTest,
                         ::testing::Combine(::testing::Values(Fill::kRandom, Fill::kZeros),
                                            ::testing::ValuesIn(EdgeSizes())),
                         [](const ::testing::TestParamInfo<RoundTripTest::ParamType>& info) {
                           return std::string(std::get<0>(info.param) == Fill::kRandom ? "Random"
                                                                                       : "Zeros") +
                                  "_" + std::to_string(std::get<1>(info.param));
                         });

// Real torch.save bytes, generated once for the suite by scripts/gen_torch_sample.py.
class TorchRoundTripTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("torch");
    const auto out = dir_->path() / "sample.pt";
    ProcessResult r = RunProcess({"/usr/bin/python3",
                                  std::string(CKPTFS_SOURCE_DIR) + "/scripts/gen_torch_sample.py",
                                  out.string(), "--hidden", "512"});
    if (r.exit_code != 0) {
      error_ =
          new std::string("/usr/bin/python3 scripts/gen_torch_sample.py exited " +
                          std::to_string(r.exit_code) + " (is python3-torch installed?): " + r.err);
      return;
    }
    sample_ = new std::vector<std::byte>(ReadFileBytes(out));
  }
  static void TearDownTestSuite() {
    delete sample_;
    delete error_;
    delete dir_;
    sample_ = nullptr;
    error_ = nullptr;
    dir_ = nullptr;
  }
  static TempDir* dir_;
  static std::vector<std::byte>* sample_;
  static std::string* error_;
};
TempDir* TorchRoundTripTest::dir_ = nullptr;
std::vector<std::byte>* TorchRoundTripTest::sample_ = nullptr;
std::string* TorchRoundTripTest::error_ = nullptr;

TEST_F(TorchRoundTripTest, ReadsBackBitwiseAtEverySize) {
  ASSERT_EQ(error_, nullptr) << *error_;
  ASSERT_NE(sample_, nullptr);
  const std::vector<std::byte>& sample = *sample_;
  // A hidden size of 512 gives about 25 MB (weights and Adam state).
  ASSERT_GT(sample.size(), 20 * kMiB);
  std::vector<size_t> sizes = EdgeSizes();
  sizes.push_back(sample.size());
  for (size_t size : sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    // Prefixes of the checkpoint; 100 MiB is the checkpoint repeated.
    std::vector<std::byte> data(size);
    for (size_t done = 0; done < size;) {
      size_t n = std::min(sample.size(), size - done);
      std::memcpy(data.data() + done, sample.data(), n);
      done += n;
    }
    TempDir dir("torch-roundtrip");
    CheckRoundTrip(dir.path(), data, size + 5);
  }
}

}  // namespace
}  // namespace ckptfs::testing
