// The ckptfs command, run as a subprocess: put/get round-trip, errors, help.
#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kMiB = 1u << 20;

class CliTest : public ::testing::Test {
 protected:
  ProcessResult Ckptfs(std::vector<std::string> args,
                       const std::filesystem::path& stdin_path = "/dev/null",
                       const std::filesystem::path& stdout_path = {}) {
    args.insert(args.begin(), CKPTFS_BINARY);
    return RunProcess(args, stdin_path, stdout_path);
  }
  TempDir dir_{"cli"};
  const std::string store_ = (dir_.path() / "store").string();
};

TEST_F(CliTest, PutThenGetReturnsTheSameBytes) {
  const auto in = dir_.path() / "in.bin";
  const auto out = dir_.path() / "out.bin";
  const std::vector<std::byte> data = PatternBytes(7, 0, 9 * kMiB + 12345);
  WriteFileBytes(in, data);

  ProcessResult put = Ckptfs({"put", store_, "ckpt/step-100.pt", "--create"}, in);
  ASSERT_EQ(put.exit_code, 0) << put.err;
  ProcessResult get = Ckptfs({"get", store_, "ckpt/step-100.pt"}, "/dev/null", out);
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_TRUE(BytesEqual(data, ReadFileBytes(out)));

  // Another codec, and an empty content.
  ProcessResult zstd = Ckptfs({"put", store_, "copy", "--codec", "zstd:3"}, in);
  ASSERT_EQ(zstd.exit_code, 0) << zstd.err;
  ASSERT_EQ(Ckptfs({"get", store_, "copy"}, "/dev/null", out).exit_code, 0);
  EXPECT_TRUE(BytesEqual(data, ReadFileBytes(out)));
  ASSERT_EQ(Ckptfs({"put", store_, "empty"}).exit_code, 0);
  ASSERT_EQ(Ckptfs({"get", store_, "empty"}, "/dev/null", out).exit_code, 0);
  EXPECT_EQ(std::filesystem::file_size(out), 0u);

  ProcessResult ls = Ckptfs({"ls", store_});
  EXPECT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find("ckpt/step-100.pt"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("copy"), std::string::npos) << ls.out;
  ProcessResult verify = Ckptfs({"verify", store_});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("no problems"), std::string::npos) << verify.out;
}

TEST_F(CliTest, GetOfAMissingNameExitsOneAndSaysSo) {
  const auto in = dir_.path() / "in.bin";
  WriteFileBytes(in, PatternBytes(8, 0, 1000));
  ASSERT_EQ(Ckptfs({"put", store_, "present", "--create"}, in).exit_code, 0);

  ProcessResult get = Ckptfs({"get", store_, "missing"});
  EXPECT_EQ(get.exit_code, 1);
  EXPECT_TRUE(get.out.empty()) << get.out;
  EXPECT_NE(get.err.find("no content is named 'missing'"), std::string::npos) << get.err;

  ProcessResult no_store = Ckptfs({"get", (dir_.path() / "nowhere").string(), "x"});
  EXPECT_EQ(no_store.exit_code, 1);
  EXPECT_NE(no_store.err.find("no ckptfs store"), std::string::npos) << no_store.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "nowhere"));
}

TEST_F(CliTest, HelpExitsZero) {
  ProcessResult help = Ckptfs({"--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  for (const char* word : {"put", "get", "verify", "gc"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << help.out;
  }
  ProcessResult usage = Ckptfs({"frobnicate"});
  EXPECT_EQ(usage.exit_code, 2) << usage.out << usage.err;
}

}  // namespace
}  // namespace ckptfs::testing
