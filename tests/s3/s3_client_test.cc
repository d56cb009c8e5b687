// The S3 client against a real radosgw (tests/s3/test_s3_client.py starts the Ceph fixture, seeds
// a few objects with boto3 and runs this binary with AWS_* set; run alone, every test skips).
//
// Environment from the driver: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL,
// S3_TEST_BUCKET (created), RGW_PID (the gateway, for SIGSTOP/SIGCONT).
#include "engine/objstore/s3_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "engine/objstore/remote_packs.h"
#include "engine/objstore/sigv4.h"
#include "engine/store/record.h"

namespace ckptfs::objstore {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = rng();
    std::memcpy(&out[i], &r, std::min<size_t>(8, n - i));
  }
  return out;
}

MutableBytes Mut(std::string& s) { return {reinterpret_cast<std::byte*>(s.data()), s.size()}; }

std::string Str(const Buffer& b) { return std::string(AsChars(b.bytes())); }

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bucket_ = Env("S3_TEST_BUCKET");
    if (bucket_.empty()) GTEST_SKIP() << "run by tests/s3/test_s3_client.py (needs a cluster)";
    Result<S3Config> cfg = ResolveS3Config("", SystemEnvironment());
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    cfg_ = *cfg;
    cfg_.multipart_threshold = 8 << 20;
    cfg_.part_bytes = 5 << 20;
    client_ = Open(cfg_);
    prefix_ = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/";
  }
  std::unique_ptr<S3Client> Open(const S3Config& cfg) {
    Result<std::unique_ptr<S3Client>> c = S3Client::Open(cfg);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  S3Config cfg_;
  std::string bucket_, prefix_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3ClientTest, PutGetHeadRangeDelete) {
  std::string key = prefix_ + "a b+c$d/é";  // needs URI encoding in the path and the signature
  std::string data = RandomBytes(300 << 10, 1);
  ASSERT_TRUE(client_->Put(bucket_, key, AsBytes(data)).ok());

  Result<ObjectInfo> info = client_->Head(bucket_, key);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size, data.size());
  EXPECT_EQ(info->sha256, Sha256Hex(AsBytes(data)));
  EXPECT_NEAR(static_cast<double>(info->last_modified), static_cast<double>(::time(nullptr)), 120);

  Result<Buffer> back = client_->Get(bucket_, key);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Str(*back), data);

  Result<Buffer> range = client_->GetRange(bucket_, key, 1000, 5000);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_EQ(Str(*range), data.substr(1000, 5000));
  Result<Buffer> tail = client_->GetRange(bucket_, key, data.size() - 10, 100);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_EQ(Str(*tail), data.substr(data.size() - 10));
  Result<Buffer> past = client_->GetRange(bucket_, key, data.size() + 5, 10);
  ASSERT_TRUE(past.ok()) << past.status().ToString();
  EXPECT_EQ(past->size(), 0u);

  ASSERT_TRUE(client_->Put(bucket_, prefix_ + "empty", {}).ok());
  Result<Buffer> empty = client_->Get(bucket_, prefix_ + "empty");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->size(), 0u);

  ASSERT_TRUE(client_->Delete(bucket_, key).ok());
  EXPECT_TRUE(client_->Head(bucket_, key).status().IsNotFound());
  EXPECT_TRUE(client_->Get(bucket_, key).status().IsNotFound());
  EXPECT_TRUE(client_->GetRange(bucket_, key, 0, 10).status().IsNotFound());
  EXPECT_TRUE(client_->Delete(bucket_, key).ok());  // absent: still OK
  EXPECT_TRUE(client_->Get("no-such-bucket-here", "k").status().IsNotFound());
}

TEST_F(S3ClientTest, MultipartFromMemoryAndFile) {
  std::string data = RandomBytes((13 << 20) + 12345, 2);  // three parts, the last one short
  S3Stats before = client_->stats();
  ASSERT_TRUE(client_->Put(bucket_, prefix_ + "mem", AsBytes(data)).ok());
  // create + 3 parts + complete
  EXPECT_EQ(client_->stats().requests - before.requests, 5u);
  Result<ObjectInfo> info = client_->Head(bucket_, prefix_ + "mem");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size, data.size());
  EXPECT_NE(info->etag.find("-3"), std::string::npos) << info->etag;  // a multipart ETag
  EXPECT_EQ(info->sha256, Sha256Hex(AsBytes(data)));
  Result<Buffer> back = client_->Get(bucket_, prefix_ + "mem");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(Str(*back) == data);

  std::filesystem::path file = std::filesystem::temp_directory_path() /
                               ("s3-client-test-" + std::to_string(::getpid()));
  std::string fdata = RandomBytes(11 << 20, 3);
  std::ofstream(file, std::ios::binary) << fdata;
  Status put = client_->PutFile(bucket_, prefix_ + "file", file);
  std::filesystem::remove(file);
  ASSERT_TRUE(put.ok()) << put.ToString();
  Result<Buffer> fback = client_->Get(bucket_, prefix_ + "file");
  ASSERT_TRUE(fback.ok()) << fback.status().ToString();
  EXPECT_TRUE(Str(*fback) == fdata);
  Result<Buffer> across = client_->GetRange(bucket_, prefix_ + "file", (5 << 20) - 7, 14);
  ASSERT_TRUE(across.ok());
  EXPECT_EQ(Str(*across), fdata.substr((5 << 20) - 7, 14));  // across a part boundary

  EXPECT_TRUE(client_->PutFile(bucket_, prefix_ + "x", "/nonexistent/file").IsNotFound());
  // Nothing left half-uploaded.
  Result<std::vector<UploadEntry>> uploads = client_->ListUploads(bucket_, prefix_);
  ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
  EXPECT_TRUE(uploads->empty());
}

TEST_F(S3ClientTest, ListPagesAndPrefixes) {
  for (int i = 0; i < 25; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "obj-%03d", i);
    ASSERT_TRUE(client_->Put(bucket_, prefix_ + "in/" + name, AsBytes(std::string(i, 'x'))).ok());
  }
  ASSERT_TRUE(client_->Put(bucket_, prefix_ + "out", AsBytes("o")).ok());
  Result<ListPage> first = client_->ListOnePage(bucket_, prefix_ + "in/", "", 10);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->objects.size(), 10u);
  EXPECT_FALSE(first->next_continuation_token.empty());
  Result<std::vector<ObjectEntry>> all = client_->List(bucket_, prefix_ + "in/");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 25u);
  for (int i = 0; i < 25; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "obj-%03d", i);
    EXPECT_EQ((*all)[i].key, prefix_ + "in/" + name);
    EXPECT_EQ((*all)[i].size, static_cast<uint64_t>(i));
    EXPECT_GT((*all)[i].last_modified, 0);
  }
  Result<std::vector<ObjectEntry>> everything = client_->List(bucket_, prefix_);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->size(), 26u);
  Result<std::vector<ObjectEntry>> none = client_->List(bucket_, prefix_ + "nothing/");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// The driver stored "seeded/bad-checksum" with boto3: its bytes disagree with the SHA-256 in its
// metadata, as if they were damaged at rest or on the way.
TEST_F(S3ClientTest, ChecksumMismatchIsCorruption) {
  Result<Buffer> bad = client_->Get(bucket_, "seeded/bad-checksum");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsCorruption()) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("seeded/bad-checksum"), std::string::npos);
  // Objects without our checksum (written by other tools) read as they are.
  Result<Buffer> foreign = client_->Get(bucket_, "seeded/foreign");
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  EXPECT_EQ(Str(*foreign), "written by boto3");
  // A caller that knows the SHA-256 (a content-addressed key) has it checked instead.
  std::string sha = Sha256Hex(AsBytes("written by boto3"));
  EXPECT_TRUE(client_->Get(bucket_, "seeded/foreign", sha).ok());
  EXPECT_TRUE(client_->Get(bucket_, "seeded/foreign", std::string(64, 'a')).status()
                  .IsCorruption());
  ASSERT_TRUE(client_->Put(bucket_, prefix_ + "k", AsBytes("bytes")).ok());
  EXPECT_TRUE(client_->Get(bucket_, prefix_ + "k", Sha256Hex(AsBytes("bytes"))).ok());
  EXPECT_TRUE(client_->Get(bucket_, prefix_ + "k", sha).status().IsCorruption());
}

// A caller's SHA-256 (a content-addressed key's) is not computed again: it is the payload hash
// the upload signs, so the gateway refuses bytes that do not match it and stores nothing.
TEST_F(S3ClientTest, AKnownChecksumIsSignedAndAWrongOneRefused) {
  const std::string sha = Sha256Hex(AsBytes("bytes"));
  ASSERT_TRUE(client_->Put(bucket_, prefix_ + "known", AsBytes("bytes"), sha).ok());
  EXPECT_TRUE(client_->Get(bucket_, prefix_ + "known", sha).ok());
  Status wrong =
      client_->Put(bucket_, prefix_ + "wrong", AsBytes("bytes"), Sha256Hex(AsBytes("other bytes")));
  EXPECT_FALSE(wrong.ok());
  EXPECT_TRUE(client_->Head(bucket_, prefix_ + "wrong").status().IsNotFound())
      << "an upload whose bytes do not match its checksum was stored";
}

TEST_F(S3ClientTest, WrongSecretIsAccessDeniedAndNotLogged) {
  S3Config wrong = cfg_;
  wrong.credentials.secret_access_key = "not-the-secret-0123456789";
  wrong.retry.max_attempts = 1;
  std::unique_ptr<S3Client> c = Open(wrong);
  Status st = c->Put(bucket_, prefix_ + "k", AsBytes("x"));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.ToErrno(), EACCES) << st.ToString();
  EXPECT_NE(st.message().find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
  EXPECT_EQ(st.message().find("not-the-secret"), std::string::npos);
  EXPECT_EQ(st.message().find(cfg_.credentials.secret_access_key), std::string::npos);
  EXPECT_EQ(c->stats().retries, 0u);  // a refusal is not retried
}

TEST_F(S3ClientTest, IncompleteUploadsListedAndAborted) {
  // The driver started a multipart upload under seeded/incomplete and never finished it.
  Result<std::vector<UploadEntry>> uploads = client_->ListUploads(bucket_, "seeded/");
  ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
  ASSERT_EQ(uploads->size(), 1u);
  EXPECT_EQ((*uploads)[0].key, "seeded/incomplete");
  EXPECT_GT((*uploads)[0].initiated, 0);
  ASSERT_TRUE(client_->AbortUpload(bucket_, (*uploads)[0].key, (*uploads)[0].upload_id).ok());
  uploads = client_->ListUploads(bucket_, "seeded/");
  ASSERT_TRUE(uploads.ok());
  EXPECT_TRUE(uploads->empty());
}

TEST_F(S3ClientTest, ConnectionRefusedIsRetriedThenReported) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // a port nobody listens on: bound, not listening
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  S3Config dead = cfg_;
  dead.endpoint = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  dead.retry = {3, std::chrono::milliseconds(50), std::chrono::milliseconds(200)};
  std::unique_ptr<S3Client> c = Open(dead);
  auto t0 = std::chrono::steady_clock::now();
  Result<Buffer> r = c->Get(bucket_, "k");
  auto waited = std::chrono::steady_clock::now() - t0;
  ::close(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gave up after 3 attempts"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(c->stats().requests, 3u);
  EXPECT_EQ(c->stats().retries, 2u);
  EXPECT_GE(waited, std::chrono::milliseconds(25 + 50));  // two backoffs, jittered to >= half
}

// True once every thread of `pid` is stopped (state T in /proc/PID/task/*/stat), polled until
// `timeout`.
bool WaitUntilStopped(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');  // the name may hold spaces
      if (paren == std::string::npos || paren + 2 >= line.size()) continue;  // exited
      if (line[paren + 2] != 'T' && line[paren + 2] != 't') all = false;
    }
    if (!ec && all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// The gateway stops answering (SIGSTOP) in the middle of the test and comes back 5 s later:
// the stalled request times out, is retried with backoff, and succeeds. (libcurl's low-speed
// check works in whole seconds of its own progress updates: with a 2.5 s pause, the 1 s stall
// limit once did not fire before the gateway answered, on a loaded 2-core CI machine.)
TEST_F(S3ClientTest, StalledGatewayIsRetriedUntilItAnswers) {
  pid_t rgw = static_cast<pid_t>(std::atoi(Env("RGW_PID").c_str()));
  if (rgw <= 0) GTEST_SKIP() << "RGW_PID not given";
  S3Config cfg = cfg_;
  cfg.stall_timeout = std::chrono::seconds(1);
  cfg.retry = {10, std::chrono::milliseconds(200), std::chrono::milliseconds(1000)};
  std::unique_ptr<S3Client> c = Open(cfg);
  std::string data = RandomBytes(1 << 20, 4);
  ASSERT_TRUE(c->Put(bucket_, prefix_ + "k", AsBytes(data)).ok());
  ASSERT_EQ(::kill(rgw, SIGSTOP), 0);
  // kill() returns before the gateway's threads have stopped; a GET sent meanwhile may be
  // answered at once (test.sh saw 0 retries twice, with a 2.5 s and a 5 s pause). Every
  // thread is stopped first.
  const bool stopped = WaitUntilStopped(rgw, std::chrono::seconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  std::thread resume([rgw] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5000));
    ::kill(rgw, SIGCONT);
  });
  Result<Buffer> back = c->Get(bucket_, prefix_ + "k");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  resume.join();
  ASSERT_TRUE(stopped) << "radosgw (pid " << rgw << ") did not stop within 5 s of SIGSTOP";
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(Str(*back) == data);
  EXPECT_GE(c->stats().retries, 1u) << "the GET took " << seconds << " s";
}

TEST_F(S3ClientTest, ConcurrentCallersShareTheClient) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        std::string key = prefix_ + std::to_string(t) + "/" + std::to_string(i);
        std::string data = RandomBytes(20000 + static_cast<size_t>(t * 1000 + i), t * 100 + i);
        if (!client_->Put(bucket_, key, AsBytes(data)).ok()) ++failures;
        Result<Buffer> back = client_->Get(bucket_, key);
        if (!back.ok() || Str(*back) != data) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  Result<std::vector<ObjectEntry>> all = client_->List(bucket_, prefix_);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 60u);
}

TEST_F(S3ClientTest, CreateBucketIsIdempotent) {
  EXPECT_TRUE(client_->CreateBucket(bucket_).ok());
  EXPECT_TRUE(client_->CreateBucket("ckptfs-second").ok());
  EXPECT_TRUE(client_->Put("ckptfs-second", "k", AsBytes("v")).ok());
}

// Reads on demand (remote_packs.h): one pack published as three segments, its records read
// back through ranged GETs, directly and from prefetched runs, within the prefetch budget.
TEST_F(S3ClientTest, RemotePacksReadRecordsAcrossSegmentsWithinTheBudget) {
  constexpr uint64_t kSeg = 3 << 20;
  const std::string pack = RandomBytes(8 << 20, 7);
  std::map<std::string, std::vector<PackSegment>> packs;
  for (uint64_t off = 0; off < pack.size(); off += kSeg) {
    const std::string bytes = pack.substr(off, kSeg);
    const std::string sha = Sha256Hex(AsBytes(bytes));
    ASSERT_TRUE(client_->Put(bucket_, prefix_ + "objects/" + sha, AsBytes(bytes)).ok());
    packs[PackFileName(5)].push_back({off, bytes.size(), sha});
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("remote-packs-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(RemotePacks::Record(dir, packs).ok());
  S3Location loc{bucket_, prefix_.substr(0, prefix_.size() - 1)};
  RemotePacksOptions options;
  options.prefetch_bytes = 2 << 20;
  options.run_bytes = 512 << 10;
  options.read_ahead_bytes = 1 << 20;
  options.fetch_threads = 2;
  Result<std::shared_ptr<RemotePacks>> opened = RemotePacks::Open(client_.get(), loc, dir, options);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_NE(*opened, nullptr);
  RemotePacks& remote = **opened;

  EXPECT_TRUE(remote.Holds(5, 0, pack.size()));
  EXPECT_FALSE(remote.Holds(5, pack.size() - 10, 11));  // past the published length
  EXPECT_FALSE(remote.Holds(6, 0, 1));                   // a pack it does not know

  // Header and payload spans filled from one record that spans the first two segments.
  auto read = [&](uint64_t offset, size_t length) {
    std::string header(48, '\0'), payload(length - 48, '\0');
    Status st = remote.Read(5, offset, Mut(header), Mut(payload));
    EXPECT_TRUE(st.ok()) << st.ToString();
    return header + payload;
  };
  EXPECT_EQ(read(kSeg - 1000, 5000), pack.substr(kSeg - 1000, 5000));
  const uint64_t direct_gets = remote.gets();
  EXPECT_EQ(direct_gets, 2u);  // one ranged GET per segment it spans

  // Sixteen adjacent 64 KiB records: coalesced into runs of 512 KiB, read-ahead after them.
  std::vector<RecordRange> window;
  for (uint64_t i = 0; i < 16; ++i) window.push_back({5, (4 << 20) + i * (64 << 10), 64 << 10});
  remote.WillNeed(window);
  EXPECT_LE(remote.held_bytes(), options.prefetch_bytes);
  for (const RecordRange& r : window) {
    EXPECT_EQ(read(r.offset, r.length), pack.substr(r.offset, r.length));
  }
  // Two runs for the window, two more read ahead: not one GET per record.
  EXPECT_LE(remote.gets() - direct_gets, 4u);
  // A window larger than the budget is prefetched only as far as the budget allows; the rest
  // is read directly, and every byte comes back right.
  window.clear();
  for (uint64_t i = 0; i < 64; ++i) window.push_back({5, i * (96 << 10), 96 << 10});
  remote.WillNeed(window);
  EXPECT_LE(remote.held_bytes(), options.prefetch_bytes);
  for (const RecordRange& r : window) {
    EXPECT_EQ(read(r.offset, r.length), pack.substr(r.offset, r.length));
    EXPECT_LE(remote.held_bytes(), options.prefetch_bytes);
  }

  // A record that spans two segments is prefetched too, as one run in each (read-ahead off):
  // both runs are held once planned, and reading the record takes what they fetched.
  {
    RemotePacksOptions spanning = options;
    spanning.read_ahead_bytes = 0;
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(RemotePacks::Record(dir, packs).ok());
    Result<std::shared_ptr<RemotePacks>> other =
        RemotePacks::Open(client_.get(), loc, dir, spanning);
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    RemotePacks& r = **other;
    const uint64_t at = 2 * kSeg - 3000;
    r.WillNeed({{5, at, 5000}});
    EXPECT_EQ(r.held_bytes(), 5000u);
    std::string header(48, '\0'), payload(5000 - 48, '\0');
    Status st = r.Read(5, at, Mut(header), Mut(payload));
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(header + payload, pack.substr(at, 5000));
    EXPECT_EQ(r.gets(), 2u);        // the two runs, no direct GET besides
    EXPECT_EQ(r.held_bytes(), 0u);  // both read to their ends: dropped
  }

  // A segment gone from the bucket: the read fails with an error, not with wrong bytes.
  ASSERT_TRUE(client_->Delete(bucket_, prefix_ + "objects/" + packs[PackFileName(5)][2].sha256)
                  .ok());
  std::string header(48, '\0'), payload(1000, '\0');
  EXPECT_FALSE(remote.Read(5, 7 << 20, Mut(header), Mut(payload)).ok());
}

}  // namespace
}  // namespace ckptfs::objstore
