#include "engine/snapshot/snapshot_engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "engine/codec/codec.h"
#include "engine/codec/piece_codec.h"
#include "engine/store/record.h"
#include "engine/util/file.h"

namespace ckptfs::snapshot {
namespace {

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class SnapshotEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckptfs-snapshot-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Engine> Open(EngineOptions o) {
    o.backend = BackendKind::kCpu;
    o.workers = 2;
    auto e = Engine::Open(NewDirSink(dir_), 0, 1, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(*e);
  }

  // Rebuilds the file a commit describes from the records in the packs (a reference chunk
  // comes from `known`, the chunks of earlier commits).
  std::string Rebuild(const std::string& version, std::map<std::string, std::string>* known) {
    auto c = nlohmann::json::parse(ReadAll(dir_ / ("commit-" + version + "-rank0.json")));
    std::string pack = ReadAll(dir_ / PackFileName(c["pack_id"].get<uint32_t>()));
    std::string out;
    for (const auto& ch : c["chunks"]) {
      std::string id = ch[0].get<std::string>();
      if (ch.size() == 4) {
        uint64_t off = ch[2].get<uint64_t>();
        auto h = RecordHeader::Decode(AsBytes(std::string_view(pack).substr(off, 64)));
        EXPECT_TRUE(h.ok());
        std::string raw(h->raw_len, '\0');
        auto body =
            SplitRecordPayload(*h, AsBytes(std::string_view(pack).substr(off + 64, h->stored_len)));
        EXPECT_TRUE(body.ok());
        Bytes base;
        if (body->base) {
          EXPECT_TRUE(known->count(body->base->Hex())) << "delta against an unknown chunk";
          base = AsBytes((*known)[body->base->Hex()]);
          ++deltas_;
        }
        Status s = DecodePiece({h->transform(), h->width(), h->codec}, body->encoded, base,
                               {reinterpret_cast<std::byte*>(raw.data()), raw.size()});
        EXPECT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(ChunkId::Of(AsBytes(raw)).Hex(), id);
        (*known)[id] = raw;
      }
      EXPECT_TRUE(known->count(id)) << "reference to an unknown chunk";
      out += (*known)[id];
    }
    EXPECT_EQ(out.size(), c["size"].get<uint64_t>());
    return out;
  }

  std::filesystem::path dir_;
  int deltas_ = 0;  // delta records Rebuild decoded
};

TEST_F(SnapshotEngineTest, SecondSnapshotCopiesAndStoresOnlyChangedBlocks) {
  EngineOptions o;
  o.block_bytes = 64 << 10;
  o.ring_bytes = 512 << 10;  // smaller than the state: staging waits for persist
  auto engine = Open(o);
  std::mt19937 rng(1);
  std::vector<std::vector<float>> layers(6, std::vector<float>(100000));
  for (auto& l : layers)
    for (float& x : l) x = static_cast<float>(rng()) / 1e9f;
  auto descs = [&] {
    std::vector<TensorDesc> d;
    for (size_t i = 0; i < layers.size(); ++i) {
      d.push_back({"layer" + std::to_string(i),
                   "F32",
                   {100000},
                   layers[i].data(),
                   -1,
                   layers[i].size() * 4,
                   {},
                   {}});
    }
    return d;
  };
  auto s1 = *engine->Start("v1", descs());
  ASSERT_TRUE(s1->Wait().ok());
  SnapshotStats st1 = s1->stats();
  const uint64_t blocks_per_layer = (400000 + o.block_bytes - 1) / o.block_bytes;
  EXPECT_EQ(st1.blocks, 6 * blocks_per_layer);
  EXPECT_EQ(st1.blocks_unchanged, 0u);
  EXPECT_EQ(st1.bytes_copied, 6 * 400000u);

  for (size_t i = 0; i < 3; ++i) layers[i][12345] += 1.0f;  // one block of each of 3 layers
  for (size_t i = 3; i < 6; ++i)
    for (float& x : layers[i]) x *= 1.5f;  // whole layers
  auto s2 = *engine->Start("v2", descs());
  ASSERT_TRUE(s2->Wait().ok());
  SnapshotStats st2 = s2->stats();
  EXPECT_EQ(st2.blocks_unchanged, 3 * (blocks_per_layer - 1));
  EXPECT_EQ(st2.bytes_copied, 3 * o.block_bytes + 3 * 400000u);
  EXPECT_EQ(st2.records_written, 3 + 3 * blocks_per_layer + 1);  // + the header

  std::map<std::string, std::string> known;
  std::string f1 = Rebuild("v1", &known);
  std::string f2 = Rebuild("v2", &known);
  uint64_t hlen = *reinterpret_cast<const uint64_t*>(f2.data());
  auto header = nlohmann::json::parse(f2.substr(8, hlen));
  for (size_t i = 0; i < layers.size(); ++i) {
    auto off = header["layer" + std::to_string(i)]["data_offsets"];
    EXPECT_EQ(f2.substr(8 + hlen + off[0].get<uint64_t>(), 400000),
              std::string(reinterpret_cast<const char*>(layers[i].data()), 400000))
        << "layer " << i;
  }
  EXPECT_EQ(header["__metadata__"]["ckptfs.version"], "v2");
}

TEST_F(SnapshotEngineTest, DuplicateNamesFailAndTheEngineStaysUsable) {
  auto engine = Open(EngineOptions{});
  std::vector<int64_t> x(10, 3);
  std::vector<TensorDesc> d = {{"a", "I64", {10}, x.data(), -1, 80, {}, {}},
                               {"a", "I64", {10}, x.data(), -1, 80, {}, {}}};
  auto s = *engine->Start("bad", d);
  EXPECT_FALSE(s->WaitStaged().ok());
  EXPECT_FALSE(s->Wait().ok());
  d.pop_back();
  auto ok = *engine->Start("good", d);
  EXPECT_TRUE(ok->Wait().ok());
}

TEST_F(SnapshotEngineTest, MetadataGoesIntoTheHeaderAndReservedKeysFail) {
  auto engine = Open(EngineOptions{});
  std::vector<int64_t> x(10, 3);
  std::vector<TensorDesc> d = {{"a", "I64", {10}, x.data(), -1, 80, {}, {}}};
  auto bad = *engine->Start("m0", d, {{"ckptfs.rank", "7"}});
  EXPECT_FALSE(bad->Wait().ok());
  auto s = *engine->Start("m1", d, {{"ckptfs.extra", R"({"step": 5})"}, {"user", "x"}});
  ASSERT_TRUE(s->Wait().ok());
  std::map<std::string, std::string> known;
  const std::string f = Rebuild("m1", &known);
  const uint64_t hlen = *reinterpret_cast<const uint64_t*>(f.data());
  auto header = nlohmann::json::parse(f.substr(8, hlen));
  EXPECT_EQ(header["__metadata__"]["ckptfs.extra"], R"({"step": 5})");
  EXPECT_EQ(header["__metadata__"]["user"], "x");
  EXPECT_EQ(header["__metadata__"]["ckptfs.rank"], "0");
}

// A training step: every weight moves a little.
void Step(std::vector<float>* v, float lr) {
  for (size_t i = 0; i < v->size(); ++i) (*v)[i] -= lr * (*v)[i] * ((i % 7) - 3.0f);
}

TEST_F(SnapshotEngineTest, ChangedBlocksAreDeltasAgainstThePreviousSnapshotWithinTheChainBound) {
  EngineOptions o;
  o.block_bytes = 64 << 10;
  o.max_delta_chain = 2;
  auto engine = Open(o);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> w(200000);
  for (float& x : w) x = normal(rng);
  auto descs = [&] {
    return std::vector<TensorDesc>{{"w", "F32", {200000}, w.data(), -1, w.size() * 4, {}, {}}};
  };
  const uint64_t blocks = (w.size() * 4 + o.block_bytes - 1) / o.block_bytes;
  std::map<std::string, std::string> known;
  std::vector<SnapshotStats> st;
  for (int v = 0; v < 4; ++v) {
    if (v > 0) Step(&w, 1e-4f);
    std::string name = "v";
    name += static_cast<char>('0' + v);
    auto snap = *engine->Start(name, descs());
    ASSERT_TRUE(snap->Wait().ok());
    st.push_back(snap->stats());
    deltas_ = 0;
    const std::string f = Rebuild(name, &known);
    EXPECT_EQ(f.substr(f.size() - w.size() * 4),
              std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4))
        << name;
    EXPECT_EQ(static_cast<uint64_t>(deltas_), st.back().records_delta);
  }
  EXPECT_EQ(st[0].records_delta, 0u);
  EXPECT_EQ(st[1].records_delta, blocks);  // against v0
  EXPECT_EQ(st[2].records_delta, 0u);      // v1's chain is full (2): stored whole
  EXPECT_EQ(st[3].records_delta, blocks);  // against v2
  EXPECT_LT(st[1].record_bytes, st[0].record_bytes * 3 / 4);
  EXPECT_LT(st[1].record_bytes, st[2].record_bytes * 3 / 4);
}

TEST_F(SnapshotEngineTest, ABaseThatCannotBeReadBackMeansAWholeRecord) {
  EngineOptions o;
  o.block_bytes = 64 << 10;
  auto engine = Open(o);
  std::vector<float> w(100000, 0.5f);
  for (size_t i = 0; i < w.size(); ++i) w[i] += 1e-3f * static_cast<float>(i % 1000);
  auto descs = [&] {
    return std::vector<TensorDesc>{{"w", "F32", {100000}, w.data(), -1, w.size() * 4, {}, {}}};
  };
  auto s1 = *engine->Start("v1", descs());
  ASSERT_TRUE(s1->Wait().ok());
  // What gc rewriting the pack would look like: other bytes where the records were.
  auto c = nlohmann::json::parse(ReadAll(dir_ / "commit-v1-rank0.json"));
  const auto pack = dir_ / PackFileName(c["pack_id"].get<uint32_t>());
  std::string bytes = ReadAll(pack);
  std::fill(bytes.begin() + kPackHeaderBytes, bytes.end(), 'x');
  {
    std::ofstream f(pack, std::ios::binary | std::ios::trunc);
    f << bytes;
  }
  Step(&w, 1e-4f);
  auto s2 = *engine->Start("v2", descs());
  ASSERT_TRUE(s2->Wait().ok());
  const uint64_t blocks = (w.size() * 4 + o.block_bytes - 1) / o.block_bytes;
  EXPECT_EQ(s2->stats().records_delta, 0u);
  EXPECT_EQ(s2->stats().delta_bases_unreadable, blocks);
  std::map<std::string, std::string> known;
  const std::string f = Rebuild("v2", &known);
  EXPECT_EQ(f.substr(f.size() - w.size() * 4),
            std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4));
}

}  // namespace
}  // namespace ckptfs::snapshot
