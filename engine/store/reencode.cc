// Reverse deltas (Store, store.h; docs/engine.md "Read path"): after a content commits, each
// of its pieces X whose base B (the same piece of the previous version) is whole ends up whole,
// and B is re-encoded as a delta against X. The writer stores such an X whole in the first
// place (Store::WritesWhole) and records the pair ("R" rows): then only B is re-encoded. A
// piece written as a forward delta (its base was a delta then, or an older store) is made
// whole here. The newest version then decodes one record per piece; the version before it
// two, and so on back to the last whole piece.
//
// Compression behind the writer (StoreOptions::compress_behind, the default): the writer
// stores every whole piece raw, so that a save pays chunking and hashing but no encoding,
// and records it ("R" rows, without a base where it had none). Here such an X is encoded
// whole and its raw record replaced, whether or not a base B is re-encoded against it.
//
// Which pieces stay whole: a piece written whole without a base (a first version, a keyframe
// where the forward chain was full, a piece gc stored whole) is an anchor, never re-encoded, so
// the oldest version keeps reading at whole-record speed. A piece the re-encoder made whole
// ("promoted", a row in the content-meta table) is re-encoded against the next version's
// piece while the chain through it stays within max_delta_chain; once full, it stays whole
// and the chain starts again above it. So versions cost what forward deltas cost (one whole
// piece per max_delta_chain versions) plus the first version's anchor.
//
// Storage: the swap is made only when the two new records are no larger than the two old ones
// (the codec does not try every encoding, so B-against-X can lose). Where B is an anchor or
// its chains are full, X alone is made whole: the keyframe forward deltas would have written
// too. The old records are dead after the swap; their blocks are punched out at once.
//
// Crash safety: the new records are synced before the one catalog transaction that points
// the rows at them, and that transaction applies only if both rows still describe the records
// the re-encoder started from and no writer holds B as a delta base. Killed before it, the
// new records are an uncommitted pack tail (cut at the next open); after it, the rows are
// consistent; the punch comes last (killed before it, gc punches the dead records later).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <thread>
#include <unordered_map>

#include "engine/codec/piece_codec.h"
#include "engine/store/record.h"
#include "engine/store/store.h"
#include "engine/util/thread_role.h"

namespace ckptfs {
namespace {

// A content waiting for the re-encoder: written in the transaction that commits it, deleted
// once it was re-encoded, so that a crash or kill loses no re-encoding (Open queues them).
std::string QueuedKey(ContentId id) {
  std::string key = "Q";
  for (int shift = 56; shift >= 0; shift -= 8) key.push_back(static_cast<char>(id >> shift));
  return key;
}

// A piece written whole against a whole base (Store::WritesWhole): "R", the content, the piece
// -> the base. Written in the transaction that commits the content, deleted with its "Q" key.
std::string ReverseBasePrefix(ContentId id) {
  std::string key = "R";
  for (int shift = 56; shift >= 0; shift -= 8) key.push_back(static_cast<char>(id >> shift));
  return key;
}

std::string ReverseBaseKey(ContentId id, const ChunkId& x) {
  std::string key = ReverseBasePrefix(id);
  key.append(reinterpret_cast<const char*>(x.bytes.data()), x.bytes.size());
  return key;
}

ChunkId IdFromBytes(std::string_view bytes) {
  ChunkId id;
  std::memcpy(id.bytes.data(), bytes.data(), id.bytes.size());
  return id;
}

}  // namespace

std::string Store::PromotedKey(const ChunkId& id) {
  std::string key = "P";
  key.append(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  return key;
}

namespace {

struct Candidate {
  ChunkId x, b;
  ChunkRow x_row, b_row;
  bool b_promoted = false;  // when listed; the swap checks again
  // X was written whole (WritesWhole): only B is re-encoded, X's record stays. Otherwise X is
  // a forward delta against B, made whole here.
  bool x_whole = false;
  // X was written raw (compress_behind): compressed here, its record replaced.
  bool compress_x = false;
  // false: X has no base to re-encode (a first version's piece): only its compression.
  bool has_b = true;
};

struct Swap {
  Candidate c;
  std::optional<ChunkRow> x_whole;  // X's new whole record (none where X was written whole)
  std::optional<ChunkRow> b_delta;  // none where B gains nothing from X
};

// Runs fn(k) for every k in [0, n) on up to `threads` threads, this one among them. The
// re-encoder's helpers inherit its nice value: they take CPUs the writers and readers leave.
void ParallelFor(size_t n, unsigned threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(k);
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < std::min<size_t>(threads, n); ++t) {
    helpers.emplace_back([&] {
      SetThreadRole("reencode");
      run();
    });
  }
  run();
  for (std::thread& h : helpers) h.join();
}

}  // namespace

Status Store::MarkForReverseDeltas(Catalog::WriteTxn& txn, ContentId id) {
  return txn.Put(Table::kContentMeta, QueuedKey(id), "");
}

Status Store::MarkReverseBase(Catalog::WriteTxn& txn, ContentId id, const ChunkId& x,
                              const std::optional<ChunkId>& base) {
  if (!base) return txn.Put(Table::kContentMeta, ReverseBaseKey(id, x), "");
  return txn.Put(
      Table::kContentMeta, ReverseBaseKey(id, x),
      std::string_view(reinterpret_cast<const char*>(base->bytes.data()), base->bytes.size()));
}

Status Store::QueuePendingReverseDeltas() {
  std::vector<ContentId> pending;
  {
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
    CKPTFS_RETURN_IF_ERROR(txn.ForEach(Table::kContentMeta, "Q", "", [&](auto key, auto) {
      if (key.size() != 9) return true;
      ContentId id = 0;
      for (size_t i = 1; i < 9; ++i) id = id << 8 | static_cast<uint8_t>(key[i]);
      pending.push_back(id);
      return true;
    }));
  }
  if (!pending.empty()) {
    spdlog::info("re-encoding of {} files into reverse deltas resumes", pending.size());
  }
  for (ContentId id : pending) QueueReverseDeltas(id);
  return Status::OK();
}

void Store::QueueReverseDeltas(ContentId id) {
  {
    MutexLock lock(reencode_mu_);
    if (reencode_stopping_) return;
    reencode_queue_.push_back(id);
  }
  reencode_cv_.NotifyAll();
}

void Store::WaitReencoded() {
  {
    MutexLock lock(reencode_mu_);
    while (!reencode_queue_.empty() || reencode_busy_) reencode_cv_.Wait(lock);
  }
  // The last version's replaced records waited for the pins of the writer after it, which
  // are gone once it committed: settled means punched too.
  PunchUnpinnedReplaced();
}

void Store::PunchUnpinnedReplaced() {
  std::vector<PackLocation> dead;
  {
    MutexLock lock(mu_);
    for (auto it = punch_later_.begin(); it != punch_later_.end();) {
      if (pinned_.count(it->first) != 0) {
        ++it;
        continue;
      }
      dead.push_back(it->second);
      it = punch_later_.erase(it);
    }
  }
  // Unpinned, a replaced record stays dead: a new pin reads the row, which names its successor.
  PunchRecords(std::move(dead));
}

void Store::RunReencoder() {
  SetThreadRole("reencode");  // its CPU is not the FUSE threads' (stats, status)
  // Background work: below the writers and readers the training job waits for (Linux nice
  // values are per thread).
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10) != 0) {
    spdlog::debug("re-encoder: setpriority: {}", std::strerror(errno));
  }
  for (;;) {
    ContentId id;
    {
      MutexLock lock(reencode_mu_);
      while (!reencode_stopping_ && reencode_queue_.empty()) reencode_cv_.Wait(lock);
      if (reencode_queue_.empty()) return;  // stopping, and everything queued was done
      id = reencode_queue_.front();
      reencode_queue_.pop_front();
      reencode_busy_ = true;
    }
    Status s = ReverseDeltas(id);
    {
      // What a failed batch appended and never committed is dead: gc may take it now.
      MutexLock lock(mu_);
      reencode_appended_.clear();
    }
    if (!s.ok() && !s.IsNotFound()) {
      spdlog::warn("re-encoding content {}: {} (its pieces stay as they were written)", id,
                   s.ToString());
    }
    Status done = catalog_->Update(Catalog::SpaceUse::kFreesSpace, [&](Catalog::WriteTxn& txn) {
      std::vector<std::string> keys;
      CKPTFS_RETURN_IF_ERROR(
          txn.ForEach(Table::kContentMeta, ReverseBasePrefix(id), "", [&](auto key, auto) {
            keys.emplace_back(key);
            return true;
          }));
      for (const std::string& key : keys) {
        CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kContentMeta, key));
      }
      return txn.Delete(Table::kContentMeta, QueuedKey(id));
    });
    if (!done.ok()) spdlog::warn("content {}: {}", id, done.ToString());
    PunchUnpinnedReplaced();
    {
      MutexLock lock(reencode_mu_);
      reencode_busy_ = false;
    }
    reencode_cv_.NotifyAll();
  }
}

Status Store::ReverseDeltas(ContentId id) {
  // 1. The content's delta pieces whose base was promoted (whole).
  std::vector<Candidate> candidates;
  {
    std::shared_lock gc(gc_mu_);
    CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginRead());
    std::vector<ChunkId> ids;
    CKPTFS_RETURN_IF_ERROR(txn.ForEachChunkRef(id, 0, [&](const ChunkRef& ref) {
      ids.push_back(ref.id);
      return true;
    }));
    std::unordered_map<ChunkId, bool> seen;
    for (const ChunkId& x : ids) {
      if (!seen.emplace(x, true).second) continue;
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(x));
      if (!row || !IsDelta(row->transform)) continue;
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> base, txn.GetChunk(row->base));
      if (!base || IsDelta(base->transform) || base->raw_len != row->raw_len) continue;
      CKPTFS_ASSIGN_OR_RETURN(auto promoted, txn.Get(Table::kContentMeta, PromotedKey(row->base)));
      candidates.push_back(
          Candidate{x, row->base, *row, *base, promoted.has_value(), false, false, true});
    }
    // Pieces written whole against a whole base: both whole now, B to become a delta of X;
    // and pieces written raw (compress_behind), with or without such a base.
    std::vector<std::pair<ChunkId, std::optional<ChunkId>>> pairs;
    CKPTFS_RETURN_IF_ERROR(
        txn.ForEach(Table::kContentMeta, ReverseBasePrefix(id), "", [&](auto key, auto value) {
          if (key.size() != 9 + 32) return true;
          if (value.size() == 32) {
            pairs.emplace_back(IdFromBytes(key.substr(9)), IdFromBytes(value));
          } else if (value.empty()) {
            pairs.emplace_back(IdFromBytes(key.substr(9)), std::nullopt);
          }
          return true;
        }));
    for (const auto& [x, b] : pairs) {
      if (x == b) continue;
      CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(x));
      if (!row || IsDelta(row->transform)) continue;
      const bool compress_x = row->stored_raw() && CompressibleBehind(row->raw_len);
      std::optional<ChunkRow> base;
      if (b) {
        CKPTFS_ASSIGN_OR_RETURN(base, txn.GetChunk(*b));
        if (base && (IsDelta(base->transform) || base->raw_len != row->raw_len)) base.reset();
      }
      if (!base) {
        if (compress_x) candidates.push_back(Candidate{x, x, *row, *row, false, true, true, false});
        continue;
      }
      CKPTFS_ASSIGN_OR_RETURN(auto promoted, txn.Get(Table::kContentMeta, PromotedKey(*b)));
      candidates.push_back(
          Candidate{x, *b, *row, *base, promoted.has_value(), true, compress_x, true});
    }
  }
  // Who decodes through whom (base -> its deltas) and every chunk's depth, for the depths a
  // swap changes: one scan of the chunk rows, kept across this content's batches while no
  // other writer commits (the catalog's transaction ids follow on from ours), else redone.
  std::unordered_map<ChunkId, std::vector<ChunkId>> children;
  std::unordered_map<ChunkId, uint8_t> depth;
  uint64_t maps_valid_for = 0;  // the write transaction id the maps are current for
  const unsigned reencode_threads = options_.worker_threads > 0
                                        ? static_cast<unsigned>(options_.worker_threads)
                                        : std::max(1u, std::thread::hardware_concurrency());
  // 2. Encodes a batch, the candidates from i on (i moves past them): X whole, B against X,
  // and appends the records (durable before the catalog names them, step 3), each to the pack
  // lane of the records that die when it does (record.h): the next version's re-encoding
  // replaces the wholes, and a contiguous run of dead records punches out without waste.
  auto encode_batch = [&](size_t& i) -> Result<std::vector<Swap>> {
    struct Encoded {
      RecordHeader header;
      Buffer payload;
    };
    using Pair = std::pair<std::optional<Encoded>, std::optional<Encoded>>;
    // The batch: pieces up to reencode_batch_bytes, encoded in parallel (each candidate on its
    // own), appended in order.
    const size_t first = i;
    for (uint64_t bytes = 0; i < candidates.size() && bytes < options_.reencode_batch_bytes; ++i) {
      bytes += candidates[i].x_row.raw_len;
    }
    std::vector<std::optional<Pair>> results(i - first);
    ParallelFor(i - first, reencode_threads, [&](size_t k) {
      const Candidate& c = candidates[first + k];
      // B is needed to rebuild a forward-delta X, or to become a delta of X.
      const bool need_b = c.has_b && (!c.x_whole || c.b_promoted);
      if (c.x_whole && !c.compress_x && !need_b) {
        // Nothing to encode (X stays as written, B is an anchor): the commit only records X
        // as promoted. Decoding B and X for it cost the save after a first version two
        // decodes of every piece, for nothing.
        results[k] = Pair();
        return;
      }
      // B once, where needed: from the cache where it still is (the writer cached it as this
      // version's delta base), else from its record. X from its record and B's bytes (decoding
      // X alone would rebuild B again).
      std::shared_ptr<const Buffer> b_cached;
      if (need_b) b_cached = cache_.Lookup(c.b, /*streamed=*/true);
      Result<Buffer> b_decoded = [&]() -> Result<Buffer> {
        if (!need_b || b_cached) return Buffer();
        std::shared_lock gc(gc_mu_);
        return reader_->Decode(c.b, c.b_row);
      }();
      if (!b_decoded.ok()) return;  // moved or dropped meanwhile: leave it
      const Buffer& b_raw = b_cached ? *b_cached : *b_decoded;
      // X: written whole, from the cache (the writer cached it as the next version's base)
      // or its record; else rebuilt from its forward delta and B's bytes.
      std::shared_ptr<const Buffer> x_cached;
      if (c.x_whole) x_cached = cache_.Lookup(c.x, /*streamed=*/true);
      Result<Buffer> x_raw = [&]() -> Result<Buffer> {
        if (x_cached) return Buffer();
        std::shared_lock gc(gc_mu_);
        return c.x_whole ? reader_->Decode(c.x, c.x_row)
                         : reader_->DecodeWithBase(c.x, c.x_row, b_raw);
      }();
      if (!x_raw.ok()) return;
      const Buffer& x_bytes = x_cached ? *x_cached : *x_raw;
      std::optional<Encoded> whole_x;
      if (!c.x_whole || c.compress_x) {
        EncodedPiece whole = EncodePiece(*options_.codec, x_bytes.bytes(), c.x_row.width, nullptr);
        if (!c.x_whole || !whole.stored_raw()) {  // a raw X that does not shrink stays as it is
          Buffer payload = whole.stored_raw() ? std::move(*x_raw) : std::move(whole.stored);
          RecordHeader h = RecordHeader::For(c.x, c.x_row.raw_len, whole.encoding, payload.bytes());
          whole_x = Encoded{h, std::move(payload)};
        }
      }
      std::optional<Encoded> delta;
      if (c.has_b && c.b_promoted) {  // an anchor stays whole: no need to try
        EncodedPiece d = EncodePiece(*options_.codec, b_raw.bytes(), c.b_row.width, &x_bytes);
        // Where X stays as written, the commit (step 3) takes B's delta only if it is smaller
        // than B: one that is not would be appended only to die.
        const uint64_t delta_len = kRecordHeaderBytes + kChunkIdBytes + d.stored.size();
        if (IsDelta(d.encoding.transform) && (!c.x_whole || delta_len < c.b_row.length)) {
          RecordHeader h =
              RecordHeader::ForDelta(c.b, c.b_row.raw_len, d.encoding, c.x, d.stored.bytes());
          delta = Encoded{h, std::move(d.stored)};
        }
      }
      results[k] = Pair(std::move(whole_x), std::move(delta));
    });
    std::vector<Swap> swaps;
    std::vector<Pair> encoded;
    for (size_t k = 0; k < results.size(); ++k) {
      if (!results[k]) continue;
      encoded.push_back(std::move(*results[k]));
      swaps.push_back(Swap{candidates[first + k], std::nullopt, std::nullopt});
    }
    {
      std::shared_lock gc(gc_mu_);
      // Until the commit names them, gc keeps them (reencode_appended_).
      auto keep_from_gc = [this](const ChunkRow& row) {
        MutexLock lock(mu_);
        reencode_appended_.push_back(PackLocation{row.pack_id, row.offset, row.length});
      };
      for (size_t k = 0; k < swaps.size(); ++k) {
        if (!encoded[k].first) continue;
        Encoded& w = *encoded[k].first;
        // Lanes (record.h): a first version's piece stays whole for good; a later one's
        // becomes a delta when the next version arrives, as the other wholes of its version.
        const PackLane lane = swaps[k].c.has_b ? PackLane::kMain : PackLane::kLasting;
        CKPTFS_ASSIGN_OR_RETURN(PackLocation loc,
                                packs_->Append(w.header, std::move(w.payload), std::nullopt, lane));
        swaps[k].x_whole = RowOf(w.header, loc);
        keep_from_gc(*swaps[k].x_whole);
      }
      for (size_t k = 0; k < swaps.size(); ++k) {
        if (!encoded[k].second) continue;
        Encoded& d = *encoded[k].second;
        CKPTFS_ASSIGN_OR_RETURN(PackLocation loc, packs_->Append(d.header, std::move(d.payload),
                                                                 swaps[k].c.x, PackLane::kLasting));
        swaps[k].b_delta = RowOf(d.header, loc);
        swaps[k].b_delta->base = swaps[k].c.x;
        keep_from_gc(*swaps[k].b_delta);
      }
    }
    return swaps;
  };
  // 3. Commits a batch once its records were synced (`synced`: how that went): one
  // transaction, under gc_mu_ exclusive (no reader between a row lookup and its record read,
  // no writer between appending and pinning).
  auto commit_batch = [&](const std::vector<Swap>& swaps, const Status& synced) -> Status {
    if (options_.before_reencode_commit) options_.before_reencode_commit();
    std::vector<PackLocation> dead;    // records the rows pointed at before
    std::vector<PackLocation> unused;  // new records no row points at
    {
      std::unique_lock gc(gc_mu_);
      MutexLock lock(mu_);
      // From here to the commit gc cannot run (gc_mu_): after it, the rows name the new records
      // or they are dead; a commit that fails leaves them dead.
      for (const Swap& s : swaps) {
        for (const std::optional<ChunkRow>& row : {s.x_whole, s.b_delta}) {
          if (!row) continue;
          auto it = std::find_if(reencode_appended_.begin(), reencode_appended_.end(),
                                 [&](const PackLocation& l) {
                                   return l.pack_id == row->pack_id && l.offset == row->offset;
                                 });
          if (it != reencode_appended_.end()) reencode_appended_.erase(it);
        }
      }
      CKPTFS_ASSIGN_OR_RETURN(auto txn, catalog_->BeginWrite());
      const uint64_t txn_id = txn.id();
      if (txn_id != maps_valid_for) {
        children.clear();
        depth.clear();
        CKPTFS_RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& cid, const ChunkRow& row) {
          depth[cid] = row.depth;
          if (IsDelta(row.transform)) children[row.base].push_back(cid);
          return true;
        }));
        ++reencode_scans_;
      }
      maps_valid_for = 0;  // until this transaction commits: a failure below leaves them stale
      std::map<uint32_t, uint64_t> pack_ends;
      uint64_t applied = 0, swapped = 0;
      for (const Swap& s : swaps) {
        const Candidate& c = s.c;
        std::optional<PackLocation> x_new, b_new;
        if (s.x_whole)
          x_new = PackLocation{s.x_whole->pack_id, s.x_whole->offset, s.x_whole->length};
        if (s.b_delta)
          b_new = PackLocation{s.b_delta->pack_id, s.b_delta->offset, s.b_delta->length};
        if ((x_new && !packs_->IsDurable(*x_new)) || (b_new && !packs_->IsDurable(*b_new))) {
          return synced.ok() ? Status::IOError("a re-encoded record failed to reach disk") : synced;
        }
        CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> x, txn.GetChunk(c.x));
        auto same = [](const std::optional<ChunkRow>& now, const ChunkRow& then) {
          return now && now->pack_id == then.pack_id && now->offset == then.offset &&
                 now->length == then.length;
        };
        // X's raw record replaced by its compressed one. The old record dies now, unless a
        // writer holds X pinned (as the next version's delta base, at the old location): then
        // it is punched once the pin is gone.
        auto retire_x = [&](const ChunkRow& old) {
          const PackLocation x_old{old.pack_id, old.offset, old.length};
          mu_.AssertHeld();  // called below, under the lock above
          if (pinned_.count(c.x) == 0) {
            dead.push_back(x_old);
          } else {
            punch_later_.emplace_back(c.x, x_old);
          }
          uint64_t& end = pack_ends[s.x_whole->pack_id];
          end = std::max(end, s.x_whole->offset + s.x_whole->length);
        };
        // Only X's raw record replaced by its compressed one: X keeps its place in every chain.
        auto compress_only = [&]() -> Status {
          if (!c.compress_x || !same(x, c.x_row) || !s.x_whole) {
            if (x_new) unused.push_back(*x_new);
            return Status::OK();
          }
          ChunkRow new_x = *s.x_whole;
          new_x.refcount = x->refcount;
          new_x.depth = x->depth;
          retire_x(*x);
          ++applied;
          return txn.PutChunk(c.x, new_x);
        };
        if (!c.has_b) {
          CKPTFS_RETURN_IF_ERROR(compress_only());
          continue;
        }
        CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> b, txn.GetChunk(c.b));
        // B is read-pinned only by a writer taking it as a delta base, which would record a
        // depth one short of the chain B joins now: leave it. X may be pinned by the next
        // version's writer: its old record stays (gc frees it once unpinned).
        const bool moved = !same(x, c.x_row) || !same(b, c.b_row) || (!c.x_whole && x->base != c.b);
        if (moved || pinned_.count(c.b) != 0) {
          if (b_new) unused.push_back(*b_new);  // gc or a writer got there first
          if (c.x_whole) {
            CKPTFS_RETURN_IF_ERROR(compress_only());  // a raw X is compressed all the same
            // Only B is left as it is: X, whole, may still become a delta of the next
            // version's piece (unpromoted, it would stay whole for good, like an anchor).
            if (!moved) CKPTFS_RETURN_IF_ERROR(txn.Put(Table::kContentMeta, PromotedKey(c.x), ""));
          } else if (x_new) {
            unused.push_back(*x_new);
          }
          continue;
        }
        // B becomes a delta against X only if the re-encoder promoted it (it is not an
        // anchor) and every chain through it stays within the bound.
        CKPTFS_ASSIGN_OR_RETURN(auto promoted, txn.Get(Table::kContentMeta, PromotedKey(c.b)));
        std::vector<ChunkId> below;  // everything that decodes through B, except X
        bool fits = promoted.has_value();
        for (std::vector<ChunkId> stack = {c.b}; fits && !stack.empty();) {
          ChunkId at = stack.back();
          stack.pop_back();
          for (const ChunkId& child : children[at]) {
            if (child == c.x) continue;
            below.push_back(child);
            stack.push_back(child);
            fits = fits && depth[child] + 1 <= static_cast<int>(options_.max_delta_chain) &&
                   below.size() < 4096;
          }
        }
        // The swap keeps the store's size: symmetric deltas (B against X, X against B) come out
        // about equal; a swap that would grow the pair by more than 1/16 is not made.
        // Where X was written whole, B's delta only has to be smaller than B.
        const uint64_t before = uint64_t{x->length} + b->length;
        const bool swap =
            fits && s.b_delta &&
            (c.x_whole ? s.b_delta->length < b->length
                       : uint64_t{s.x_whole->length} + s.b_delta->length <= before + before / 16);
        // Without the swap, X alone is made whole: where B is an anchor or its chains are full
        // that is the keyframe forward deltas would write too; left a delta, X would make the
        // next version's piece a delta of a delta, and its chain would grow forward again.
        ChunkRow new_x = s.x_whole ? *s.x_whole : *x;
        new_x.refcount = x->refcount;
        new_x.depth = 1;
        if (!c.x_whole) --b->refcount;  // X no longer decodes through B
        if (s.x_whole) retire_x(*x);
        if (swap) {
          ChunkRow new_b = *s.b_delta;
          new_b.refcount = b->refcount;
          new_b.depth = 2;
          ++new_x.refcount;  // B decodes through X
          dead.push_back(PackLocation{b->pack_id, b->offset, b->length});
          CKPTFS_RETURN_IF_ERROR(txn.PutChunk(c.b, new_b));
          CKPTFS_RETURN_IF_ERROR(txn.Delete(Table::kContentMeta, PromotedKey(c.b)));
          depth[c.b] = 2;
          ++swapped;
          for (const ChunkId& d : below) {  // every chain through B is one record longer
            CKPTFS_ASSIGN_OR_RETURN(std::optional<ChunkRow> row, txn.GetChunk(d));
            if (!row) continue;
            row->depth = static_cast<uint8_t>(depth[d] + 1);
            depth[d] = row->depth;
            CKPTFS_RETURN_IF_ERROR(txn.PutChunk(d, *row));
          }
          uint64_t& end = pack_ends[new_b.pack_id];
          end = std::max(end, new_b.offset + new_b.length);
        } else {
          CKPTFS_RETURN_IF_ERROR(txn.PutChunk(c.b, *b));
          if (b_new) unused.push_back(*b_new);
        }
        // Children of B keep their place in `children`; X leaves them.
        auto& kids = children[c.b];
        kids.erase(std::remove(kids.begin(), kids.end(), c.x), kids.end());
        if (swap) children[c.x].push_back(c.b);
        CKPTFS_RETURN_IF_ERROR(txn.PutChunk(c.x, new_x));
        CKPTFS_RETURN_IF_ERROR(txn.Put(Table::kContentMeta, PromotedKey(c.x), ""));
        depth[c.x] = 1;
        ++applied;
      }
      for (const auto& [pack_id, end] : pack_ends) {
        CKPTFS_ASSIGN_OR_RETURN(std::optional<PackRow> prow, txn.GetPack(pack_id));
        CKPTFS_RETURN_IF_ERROR(
            txn.PutPack(pack_id, PackRow{std::max(prow ? prow->committed : 0, end)}));
      }
      CKPTFS_RETURN_IF_ERROR(txn.Commit());
      maps_valid_for = txn_id + 1;  // the maps hold what this transaction wrote
      ++reencode_batches_;
      spdlog::debug("reverse deltas, content {}: {} of {} pieces stored whole, {} bases re-encoded",
                    id, applied, swaps.size(), swapped);
      pieces_reencoded_ += applied;
    }
    // 4. The replaced and unused records are dead: give their blocks back, adjacent ones as one
    // range (outside the locks: no row or pin points at them, and none will).
    dead.insert(dead.end(), unused.begin(), unused.end());
    PunchRecords(std::move(dead));
    return Status::OK();
  };
  // The batches overlap: one batch's records reach the disk while the next batch encodes,
  // and it commits once both are done. The next batch reads only records this one leaves in
  // place (this one punches after the next has encoded), and its own transaction checks its
  // rows again.
  size_t next = 0;
  CKPTFS_ASSIGN_OR_RETURN(std::vector<Swap> swaps, encode_batch(next));
  for (;;) {
    if (swaps.empty()) {
      if (next >= candidates.size()) break;
      CKPTFS_ASSIGN_OR_RETURN(swaps, encode_batch(next));
      continue;
    }
    std::future<Status> synced = std::async(std::launch::async, [this] { return packs_->Sync(); });
    Result<std::vector<Swap>> following = next < candidates.size()
                                              ? encode_batch(next)
                                              : Result<std::vector<Swap>>(std::vector<Swap>());
    CKPTFS_RETURN_IF_ERROR(commit_batch(swaps, synced.get()));
    CKPTFS_ASSIGN_OR_RETURN(swaps, std::move(following));
  }
  return Status::OK();
}

void Store::PunchRecords(std::vector<PackLocation> dead) {
  std::sort(dead.begin(), dead.end(), [](const PackLocation& a, const PackLocation& b) {
    return a.pack_id != b.pack_id ? a.pack_id < b.pack_id : a.offset < b.offset;
  });
  for (size_t i = 0; i < dead.size();) {
    // The pack's runs of adjacent records, each [from, to).
    const uint32_t pack = dead[i].pack_id;
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    while (i < dead.size() && dead[i].pack_id == pack) {
      const uint64_t from = dead[i].offset;
      uint64_t to = from + dead[i].length;
      for (++i; i < dead.size() && dead[i].pack_id == pack && dead[i].offset == to; ++i) {
        to += dead[i].length;
      }
      runs.emplace_back(from, to);
    }
    Status s = packs_->PunchDead(pack, runs);
    if (!s.ok() && !s.IsNotSupported() && !s.IsNotFound()) {
      spdlog::info("punching replaced records in pack {}: {} (gc frees them later)", pack,
                   s.ToString());
    }
  }
}

}  // namespace ckptfs
