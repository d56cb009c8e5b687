#include "engine/namespace/control_protocol.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace ckptfs {
namespace {

const std::string kId(64, 'a');

Result<ControlRequest> Decode(const std::string& s) { return DecodeControlRequest(s); }

TEST(ControlProtocolTest, BeginIsBounded) {
  auto ok = Decode(R"({"op":"begin","version":"v1","rank":3,"world_size":4})");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->op, ControlRequest::Op::kBegin);
  EXPECT_EQ(ok->version, "v1");
  EXPECT_EQ(ok->rank, 3u);
  EXPECT_EQ(ok->world_size, 4u);
  for (const char* bad : {
           R"({"op":"begin","version":"v1","rank":4,"world_size":4})",
           R"({"op":"begin","version":"v1","rank":0,"world_size":0})",
           R"({"op":"begin","version":"v1","rank":0,"world_size":65537})",
           R"({"op":"begin","version":"v1","rank":-1,"world_size":4})",
           R"({"op":"begin","version":"v1","rank":1.5,"world_size":4})",
           R"({"op":"begin","version":7,"rank":0,"world_size":1})",
           R"({"op":"begin","rank":0,"world_size":1})",
       }) {
    auto r = Decode(bad);
    EXPECT_TRUE(r.status().code() == Status::Code::kInvalidArgument) << bad;
  }
}

TEST(ControlProtocolTest, MalformedRequestsAreInvalidArgument) {
  for (const char* bad : {"", "[", "[1,2]", "\"begin\"", "{}", R"({"op":3})", R"({"op":"nope"})",
                          R"({"op":"commit"})"}) {
    auto r = Decode(bad);
    EXPECT_TRUE(r.status().code() == Status::Code::kInvalidArgument) << bad << ": " << r.status().ToString();
  }
}

// The daemon used to read raw_len, length and pack_id with a narrowing get<uint32_t>(): a
// raw_len of 2^32 + 1 became 1. Every number is now bounded before use.
TEST(ControlProtocolTest, CommitNumbersAreBoundedNotTruncated) {
  auto commit = [](const std::string& chunk, const std::string& pack_id = "7") {
    return R"({"op":"commit","file":"rank_0.safetensors","size":10,"pack_id":)" + pack_id +
           R"(,"pack_length":100,"chunks":[)" + chunk + R"(],"shard":{}})";
  };
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",4294967295]")).ok());
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",4294967296]")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",4294967297]")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",1,32,4294967296]")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",1]", "4294967296")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",-1]")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",1,32]")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"abc\",1]")).status().code() == Status::Code::kInvalidArgument);
  EXPECT_TRUE(Decode(commit("[\"" + kId + "\",1,-5,40]")).status().code() == Status::Code::kInvalidArgument);
}

TEST(ControlProtocolTest, CommitRoundTrips) {
  RankCommit c;
  c.file_name = "rank_2.safetensors";
  c.size = 1ull << 40;
  c.pack_id = 0xfffffffe;
  c.pack_length = 123456789012ull;
  ASSERT_TRUE(ChunkId::FromHex(kId, &c.chunks.emplace_back().id));
  c.chunks.back().raw_len = 0xffffffff;
  CommitChunk stored;
  stored.id = ChunkId::Of(AsBytes(std::string("x")));
  stored.raw_len = 1;
  stored.stored = true;
  stored.offset = 1ull << 50;
  stored.length = 0xffffffff;
  c.chunks.push_back(stored);
  c.shard_json = R"({"rank":2,"tensors":{"w":{"dtype":"F32"}}})";
  const std::string wire = EncodeCommit(c);
  auto d = Decode(wire);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->op, ControlRequest::Op::kCommit);
  EXPECT_EQ(d->commit.file_name, c.file_name);
  EXPECT_EQ(d->commit.size, c.size);
  EXPECT_EQ(d->commit.pack_id, c.pack_id);
  EXPECT_EQ(d->commit.pack_length, c.pack_length);
  ASSERT_EQ(d->commit.chunks.size(), 2u);
  EXPECT_EQ(d->commit.chunks[0].id, c.chunks[0].id);
  EXPECT_EQ(d->commit.chunks[0].raw_len, 0xffffffffu);
  EXPECT_FALSE(d->commit.chunks[0].stored);
  EXPECT_EQ(d->commit.chunks[1].id, stored.id);
  EXPECT_TRUE(d->commit.chunks[1].stored);
  EXPECT_EQ(d->commit.chunks[1].offset, stored.offset);
  EXPECT_EQ(d->commit.chunks[1].length, stored.length);
  EXPECT_EQ(d->commit.shard_json, c.shard_json);
  EXPECT_EQ(EncodeControlRequest(*d), wire);
}

TEST(ControlProtocolTest, OtherRequestsRoundTrip) {
  ControlRequest begin;
  begin.op = ControlRequest::Op::kBegin;
  begin.version = "global_step100";
  begin.rank = 65535;
  begin.world_size = 65536;
  auto b = Decode(EncodeControlRequest(begin));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->version, begin.version);
  EXPECT_EQ(b->rank, begin.rank);
  EXPECT_EQ(b->world_size, begin.world_size);
  auto r = Decode(EncodeControlRequest(ControlRequest{}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->op, ControlRequest::Op::kReservePack);
  auto a = Decode(R"({"op":"admin","cmd":"log","version":"v1"})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->op, ControlRequest::Op::kAdmin);
  EXPECT_EQ(a->admin_json, R"({"cmd":"log","op":"admin","version":"v1"})");
  EXPECT_EQ(EncodeControlRequest(*a), a->admin_json);
  EXPECT_FALSE(a->admin_progress);
  auto p = Decode(R"({"op":"admin","cmd":"gc","progress":true})");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->admin_progress);
  // The daemon used to read it with json::value("progress", false), which throws (and ends
  // the daemon) on any other type.
  EXPECT_EQ(Decode(R"({"op":"admin","cmd":"gc","progress":1})").status().code(),
            Status::Code::kInvalidArgument);
}

class FrameTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    ::close(fds_[0]);
    if (fds_[1] >= 0) ::close(fds_[1]);
  }
  void Write(const std::string& bytes) {
    ASSERT_EQ(::write(fds_[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  void CloseWriter() {
    ::close(fds_[1]);
    fds_[1] = -1;
  }
  int fds_[2] = {-1, -1};
};

TEST_F(FrameTest, FramesThenEof) {
  ASSERT_TRUE(SendFrame(fds_[1], "hello").ok());
  ASSERT_TRUE(SendFrame(fds_[1], "").ok());
  CloseWriter();
  auto a = RecvFrame(fds_[0]);
  ASSERT_TRUE(a.ok() && *a);
  EXPECT_EQ(**a, "hello");
  auto b = RecvFrame(fds_[0]);
  ASSERT_TRUE(b.ok() && *b);
  EXPECT_EQ(**b, "");
  auto eof = RecvFrame(fds_[0]);
  ASSERT_TRUE(eof.ok());
  EXPECT_FALSE(*eof);
}

TEST_F(FrameTest, OversizedLengthIsCorruptionBeforeAnyAllocation) {
  Write(std::string("\x01\x00\x00\x10", 4));  // 256 MiB + 1
  auto r = RecvFrame(fds_[0]);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
}

TEST_F(FrameTest, TruncatedFrameIsAnError) {
  Write(std::string("\x08\x00\x00\x00" "abc", 7));
  CloseWriter();
  EXPECT_FALSE(RecvFrame(fds_[0]).ok());
}

TEST_F(FrameTest, TruncatedLengthIsAnError) {
  Write(std::string("\x08\x00", 2));
  CloseWriter();
  EXPECT_FALSE(RecvFrame(fds_[0]).ok());
}

}  // namespace
}  // namespace ckptfs
