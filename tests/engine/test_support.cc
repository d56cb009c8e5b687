#include "tests/engine/test_support.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace ckptfs::testing {
namespace {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Word k of the stream named by seed.
uint64_t PatternWord(uint64_t seed, uint64_t k) {
  return Mix64(seed * 0x9e3779b97f4a7c15ULL + k + 0x632be59bd9b4e019ULL);
}

// A small deterministic generator for sizes and offsets.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, n]; n may be 0.
  uint64_t UpTo(uint64_t n) { return n == UINT64_MAX ? Next() : Next() % (n + 1); }

 private:
  uint64_t state_;
};

}  // namespace

TempDir::TempDir(const std::string& tag) {
  std::string templ = (std::filesystem::temp_directory_path() / ("ckptfs-" + tag + "-XXXXXX"));
  if (::mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << ": " << std::strerror(errno);
  }
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

StoreOptions TestOptions() {
  StoreOptions options;
  options.cache_bytes = 8u << 20;
  options.inflight_bytes = 32u << 20;
  return options;
}

std::unique_ptr<Store> OpenStore(const std::filesystem::path& dir, const StoreOptions& options) {
  auto store = Store::Open(dir, options);
  if (!store.ok()) {
    ADD_FAILURE() << "open store " << dir << ": " << store.status().ToString();
    return nullptr;
  }
  return std::move(*store);
}

void FillPattern(uint64_t seed, uint64_t offset, MutableBytes out) {
  size_t done = 0;
  while (done < out.size()) {
    uint64_t pos = offset + done;
    uint64_t word = PatternWord(seed, pos / 8);
    size_t in_word = static_cast<size_t>(pos % 8);
    size_t n = std::min(out.size() - done, 8 - in_word);
    std::memcpy(out.data() + done, reinterpret_cast<const std::byte*>(&word) + in_word, n);
    done += n;
  }
}

std::vector<std::byte> PatternBytes(uint64_t seed, uint64_t offset, size_t size) {
  std::vector<std::byte> out(size);
  FillPattern(seed, offset, out);
  return out;
}

Result<ContentId> WriteContent(Store& store, Bytes data, uint64_t piece_seed,
                               const ContentWriter::CommitHook& hook) {
  // Odd sizes, from a single byte to a little over 3 MiB, so that pieces end anywhere
  // relative to chunk boundaries.
  static constexpr size_t kPieces[] = {1, 3, 17, 255, 4097, 65537, (1u << 20) + 3, (3u << 20) + 7};
  Rng rng(piece_seed);
  auto writer = store.NewWriter();
  while (!data.empty()) {
    size_t n = std::min(data.size(), kPieces[rng.UpTo(std::size(kPieces) - 1)]);
    CKPTFS_RETURN_IF_ERROR(writer->Append(data.first(n)));
    data = data.subspan(n);
  }
  return writer->Finish(hook);
}

Result<std::vector<std::byte>> ReadContent(const Store& store, ContentId id) {
  CKPTFS_ASSIGN_OR_RETURN(ContentRow row, store.StatContent(id));
  std::vector<std::byte> out(row.size);
  constexpr size_t kRead = (3u << 20) + 5;
  uint64_t offset = 0;
  while (offset < row.size) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(kRead, row.size - offset));
    CKPTFS_ASSIGN_OR_RETURN(size_t n,
                            store.Read(id, offset, MutableBytes(out).subspan(offset, want)));
    if (n != want) {
      return Status::Corruption("short read at offset " + std::to_string(offset) + ": " +
                                std::to_string(n) + " of " + std::to_string(want));
    }
    offset += n;
  }
  // Past the end reads nothing.
  std::byte extra[16];
  CKPTFS_ASSIGN_OR_RETURN(size_t tail, store.Read(id, row.size, MutableBytes(extra)));
  if (tail != 0) return Status::Corruption("read past the end returned bytes");
  return out;
}

::testing::AssertionResult BytesEqual(Bytes expected, Bytes actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << ", expected " << expected.size();
  }
  if (expected.empty() || std::memcmp(expected.data(), actual.data(), expected.size()) == 0) {
    return ::testing::AssertionSuccess();
  }
  auto [e, a] = std::mismatch(expected.begin(), expected.end(), actual.begin());
  return ::testing::AssertionFailure()
         << "bytes differ first at offset " << (e - expected.begin()) << " of " << expected.size()
         << " (got " << static_cast<int>(*a) << ", expected " << static_cast<int>(*e) << ")";
}

::testing::AssertionResult ContentEquals(const Store& store, ContentId id, Bytes expected) {
  auto row = store.StatContent(id);
  if (!row.ok()) {
    return ::testing::AssertionFailure()
           << "stat content " << id << ": " << row.status().ToString();
  }
  if (row->size != expected.size()) {
    return ::testing::AssertionFailure()
           << "content " << id << " has size " << row->size << ", expected " << expected.size();
  }
  auto data = ReadContent(store, id);
  if (!data.ok()) {
    return ::testing::AssertionFailure()
           << "read content " << id << ": " << data.status().ToString();
  }
  return BytesEqual(expected, *data) << " (content " << id << ")";
}

::testing::AssertionResult RandomReadsMatch(const Store& store, ContentId id, Bytes expected,
                                            uint64_t seed, int reads) {
  Rng rng(seed);
  const uint64_t size = expected.size();
  const uint64_t max_len = 3 * StoreOptions{}.chunking.max_size;
  std::vector<std::byte> buf;
  for (int i = 0; i < reads; ++i) {
    uint64_t offset = rng.UpTo(size + 16);
    // Mostly short reads, some long ones that span several chunks.
    uint64_t len = rng.UpTo(3) == 0 ? rng.UpTo(max_len) : rng.UpTo(4096);
    buf.assign(len, std::byte{0xa5});
    auto n = store.Read(id, offset, MutableBytes(buf));
    if (!n.ok()) {
      return ::testing::AssertionFailure()
             << "read " << len << " bytes at " << offset << ": " << n.status().ToString();
    }
    size_t want = offset >= size ? 0 : static_cast<size_t>(std::min(len, size - offset));
    if (*n != want) {
      return ::testing::AssertionFailure() << "read " << len << " bytes at " << offset
                                           << " returned " << *n << ", expected " << want;
    }
    auto same = BytesEqual(expected.subspan(std::min(offset, size), want), Bytes(buf).first(want));
    if (!same) return same << " (read of " << len << " bytes at offset " << offset << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult VerifyClean(const Store& store) {
  auto report = store.Verify();
  if (!report.ok()) {
    return ::testing::AssertionFailure() << "verify: " << report.status().ToString();
  }
  if (report->ok()) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure() << report->problems.size() << " problems:";
  for (const auto& p : report->problems) failure << "\n  " << p;
  return failure;
}

Result<RecordPlace> PlaceOfChunk(Store& store, ContentId id, size_t index) {
  CKPTFS_ASSIGN_OR_RETURN(auto txn, store.catalog().BeginRead());
  std::optional<ChunkRef> found;
  size_t i = 0;
  CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
    if (i++ == index) found = ref;
    return !found;
  }));
  if (!found) return Status::NotFound("content has no chunk " + std::to_string(index));
  CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(found->id));
  if (!row) return Status::NotFound("chunk row missing");
  return RecordPlace{*found, *row};
}

ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::filesystem::path& stdin_path,
                         const std::filesystem::path& stdout_path) {
  ProcessResult result;
  TempDir scratch("proc");
  const auto out_path = stdout_path.empty() ? scratch.path() / "stdout" : stdout_path;
  const auto err_path = scratch.path() / "stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.err = "posix_spawn " + argv[0] + ": " + std::strerror(rc);
    return result;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (stdout_path.empty()) result.out = ReadFileToString(out_path);
  result.err = ReadFileToString(err_path);
  return result;
}

std::string ReadFileToString(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::byte> ReadFileBytes(const std::filesystem::path& path) {
  std::string s = ReadFileToString(path);
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

void WriteFileBytes(const std::filesystem::path& path, Bytes data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

}  // namespace ckptfs::testing
