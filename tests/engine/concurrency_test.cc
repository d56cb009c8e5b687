// Criterion 6: writers and readers share one Store. Four threads write contents (two of them
// the same bytes at the same time) while four threads read contents committed earlier.
#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "engine/util/mutex.h"
#include "tests/engine/test_support.h"

namespace ckptfs::testing {
namespace {

constexpr size_t kMiB = 1u << 20;
constexpr int kWriters = 4;
constexpr int kReaders = 4;
constexpr int kContentsPerWriter = 3;
constexpr uint64_t kSharedSeed = 999;

struct Source {
  uint64_t seed = 0;
  uint64_t size = 0;
};

// Collects the first failure seen by any thread (gtest assertions stay on the main thread).
class FirstFailure {
 public:
  void Record(const std::string& what) {
    MutexLock lock(mu_);
    if (message_.empty()) message_ = what;
    ++count_;
  }
  ::testing::AssertionResult Result() const {
    MutexLock lock(mu_);
    if (count_ == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << count_ << " failures; first: " << message_;
  }

 private:
  mutable Mutex mu_;
  std::string message_ GUARDED_BY(mu_);
  int count_ GUARDED_BY(mu_) = 0;
};

TEST(ConcurrencyTest, WritersAndReadersSeeExactlyTheirBytes) {
  TempDir dir("concurrency");
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store);

  std::vector<std::pair<ContentId, Source>> old_contents;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Source src{seed, 8 * kMiB + seed * 4321};
    ASSERT_OK_AND_ASSIGN(ContentId id,
                         WriteContent(*store, PatternBytes(src.seed, 0, src.size), seed));
    old_contents.emplace_back(id, src);
  }

  FirstFailure failures;
  std::atomic<int> writers_running{kWriters};
  std::atomic<uint64_t> reads_done{0};
  std::vector<std::vector<std::pair<ContentId, Source>>> written(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int k = 0; k < kContentsPerWriter; ++k) {
        // Writers 0 and 1 start with the same content, to race on storing its chunks.
        Source src = k == 0 && w < 2 ? Source{kSharedSeed, 6 * kMiB + 1}
                                     : Source{100 + 10 * static_cast<uint64_t>(w) + k,
                                              5 * kMiB + 777 * static_cast<uint64_t>(w + k)};
        auto id = WriteContent(*store, PatternBytes(src.seed, 0, src.size), w * 10 + k);
        if (!id.ok()) {
          failures.Record("writer " + std::to_string(w) + ": " + id.status().ToString());
          break;
        }
        written[w].emplace_back(*id, src);
      }
      --writers_running;
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      uint64_t state = 0x1234567 + r;
      auto next = [&state] {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return state >> 17;
      };
      std::vector<std::byte> got, want;
      // At least a few reads each, and on until the writers are done.
      for (int i = 0; writers_running.load() > 0 || i < 20; ++i) {
        const auto& [id, src] = old_contents[next() % old_contents.size()];
        uint64_t offset = next() % src.size;
        size_t len =
            static_cast<size_t>(std::min<uint64_t>(next() % (3 * kMiB), src.size - offset));
        got.resize(len);
        want.resize(len);
        auto n = store->Read(id, offset, MutableBytes(got));
        if (!n.ok() || *n != len) {
          failures.Record("reader " + std::to_string(r) + ": read of content " +
                          std::to_string(id) + " at " + std::to_string(offset) + ": " +
                          (n.ok() ? std::to_string(*n) + " bytes" : n.status().ToString()));
          return;
        }
        FillPattern(src.seed, offset, MutableBytes(want));
        if (got != want) {
          failures.Record("reader " + std::to_string(r) + ": wrong bytes in content " +
                          std::to_string(id) + " at " + std::to_string(offset));
          return;
        }
        ++reads_done;
      }
    });
  }
  for (auto& t : threads) t.join();

  ASSERT_TRUE(failures.Result());
  EXPECT_GE(reads_done.load(), uint64_t{kReaders * 20});
  for (const auto& per_writer : written) {
    ASSERT_EQ(per_writer.size(), size_t{kContentsPerWriter});
    for (const auto& [id, src] : per_writer) {
      EXPECT_TRUE(ContentEquals(*store, id, PatternBytes(src.seed, 0, src.size)));
    }
  }
  // The two writers of the same bytes got two contents (sharing chunks, which Verify's
  // reference counts cover).
  EXPECT_NE(written[0][0].first, written[1][0].first);
  for (const auto& [id, src] : old_contents) {
    EXPECT_TRUE(ContentEquals(*store, id, PatternBytes(src.seed, 0, src.size)));
  }
  EXPECT_TRUE(VerifyClean(*store));
  ASSERT_OK_AND_ASSIGN(StoreStats st, store->Stats());
  EXPECT_EQ(st.contents, old_contents.size() + kWriters * kContentsPerWriter);
}

// Gc() runs in a loop while writers commit new contents and release their older ones, and
// readers read contents that stay live throughout.
TEST(ConcurrencyTest, GcRunsAlongsideWritersAndReaders) {
  TempDir dir("concurrency-gc");
  StoreOptions options = TestOptions();
  options.chunking = FastCdc::Params{16u << 10, 64u << 10, 256u << 10};
  options.pack_target_bytes = 4 * kMiB;
  auto store = OpenStore(dir.path(), options);
  ASSERT_TRUE(store);

  std::vector<std::pair<ContentId, Source>> kept;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Source src{seed, kMiB + seed * 4321};
    ASSERT_OK_AND_ASSIGN(ContentId id,
                         WriteContent(*store, PatternBytes(src.seed, 0, src.size), seed));
    kept.emplace_back(id, src);
  }

  FirstFailure failures;
  std::atomic<int> writers_running{kWriters};
  std::atomic<int> gcs{0};
  // The writers' last contents, under live_mu (a local: clang's analysis checks members only).
  Mutex live_mu;
  std::vector<std::pair<ContentId, Source>> live;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::optional<ContentId> previous;
      for (int k = 0; k < 40; ++k) {
        Source src{1000 + 100 * static_cast<uint64_t>(w) + k, 300 * 1024 + 997u * k};
        auto id = WriteContent(*store, PatternBytes(src.seed, 0, src.size), k);
        if (!id.ok()) {
          failures.Record("writer: " + id.status().ToString());
          break;
        }
        if (previous) {
          Status s = store->Release(*previous);
          if (!s.ok()) failures.Record("release: " + s.ToString());
        }
        previous = *id;
        if (k == 39) {
          MutexLock lock(live_mu);
          live.emplace_back(*id, src);
        }
      }
      --writers_running;
    });
  }
  threads.emplace_back([&] {
    while (writers_running.load() > 0) {
      auto report = store->Gc();
      if (!report.ok()) failures.Record("gc: " + report.status().ToString());
      ++gcs;
    }
  });
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::byte> got, want;
      for (uint64_t i = 0; writers_running.load() > 0; ++i) {
        const auto& [id, src] = kept[(i + r) % kept.size()];
        uint64_t offset = (i * 7919 + r * 104729) % src.size;
        size_t len = static_cast<size_t>(std::min<uint64_t>(200 * 1024, src.size - offset));
        got.resize(len);
        want.resize(len);
        auto n = store->Read(id, offset, MutableBytes(got));
        FillPattern(src.seed, offset, MutableBytes(want));
        if (!n.ok() || *n != len || got != want) {
          failures.Record("reader: content " + std::to_string(id) + " at " +
                          std::to_string(offset) + ": " +
                          (n.ok() ? "wrong bytes" : n.status().ToString()));
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();

  ASSERT_TRUE(failures.Result());
  EXPECT_GT(gcs.load(), 1);
  for (const auto& [id, src] : kept) {
    EXPECT_TRUE(ContentEquals(*store, id, PatternBytes(src.seed, 0, src.size)));
  }
  for (const auto& [id, src] : live) {
    EXPECT_TRUE(ContentEquals(*store, id, PatternBytes(src.seed, 0, src.size)));
  }
  EXPECT_TRUE(VerifyClean(*store));
  ASSERT_OK(store->Gc().status());
  EXPECT_TRUE(VerifyClean(*store));
}

}  // namespace
}  // namespace ckptfs::testing
