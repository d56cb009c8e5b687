#include "engine/objstore/remote_packs.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/store/record.h"
#include "engine/util/file.h"

namespace ckptfs::objstore {
namespace {

namespace fs = std::filesystem;
constexpr int kRemotePacksFormat = 1;
// Records of a prefetch window further apart than this start a new run (the bytes between
// them would be fetched for nothing).
constexpr uint64_t kRunGap = 64 << 10;

// Copies `src`, which holds the record's bytes from `at` on, into the record's two spans.
void Scatter(Bytes src, uint64_t at, MutableBytes header, MutableBytes payload) {
  for (size_t i = 0; i < src.size();) {
    const uint64_t pos = at + i;
    MutableBytes to = pos < header.size() ? header.subspan(pos)
                                          : payload.subspan(pos - header.size());
    const size_t n = std::min(to.size(), src.size() - i);
    std::memcpy(to.data(), src.data() + i, n);
    i += n;
  }
}

}  // namespace

Status RemotePacks::Record(const fs::path& cache_dir,
                           const std::map<std::string, std::vector<PackSegment>>& packs,
                           bool sync) {
  nlohmann::json doc = {{"format", kRemotePacksFormat}, {"packs", nlohmann::json::object()}};
  for (const auto& [file, segments] : packs) {
    nlohmann::json segs = nlohmann::json::array();
    for (const PackSegment& s : segments) segs.push_back({s.offset, s.length, s.sha256});
    doc["packs"][file] = std::move(segs);
  }
  if (sync) return WriteFileAtomic(cache_dir / kFileName, doc.dump());
  const std::string text = doc.dump();
  CKPTFS_ASSIGN_OR_RETURN(
      FileDescriptor fd, OpenFile(cache_dir / kFileName, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC));
  return PWriteFull(fd.get(), 0, AsBytes(text), cache_dir / kFileName);
}

Result<std::shared_ptr<RemotePacks>> RemotePacks::Open(S3Client* s3, S3Location loc,
                                                       const fs::path& cache_dir,
                                                       RemotePacksOptions options) {
  const fs::path path = cache_dir / kFileName;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return std::shared_ptr<RemotePacks>(
        new RemotePacks(s3, std::move(loc), cache_dir, {}, options));
  }
  CKPTFS_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  auto bad = [&](const std::string& why) {
    return Status::Corruption(path.string() + " " + why + "; remove the cache directory and " +
                              "mount again to restore it from the bucket");
  };
  if (doc.is_discarded() || !doc.is_object() || doc.value("format", 0) != kRemotePacksFormat ||
      !doc.contains("packs") || !doc["packs"].is_object()) {
    return bad("is not one this ckptfs reads");
  }
  std::map<uint32_t, std::vector<PackSegment>> packs;
  for (const auto& [file, segments] : doc["packs"].items()) {
    uint32_t pack_id = 0;
    if (!ParsePackFileName(file, &pack_id) || !segments.is_array()) {
      return bad("names a pack '" + file + "'");
    }
    std::vector<PackSegment>& segs = packs[pack_id];
    uint64_t end = 0;
    for (const auto& s : segments) {
      if (!s.is_array() || s.size() != 3 || !s[0].is_number_unsigned() ||
          !s[1].is_number_unsigned() || !s[2].is_string()) {
        return bad("has a malformed segment of " + file);
      }
      PackSegment seg{s[0].get<uint64_t>(), s[1].get<uint64_t>(), s[2].get<std::string>()};
      if (seg.offset != end || seg.length == 0) return bad("has a gap in the segments of " + file);
      end = seg.offset + seg.length;
      segs.push_back(std::move(seg));
    }
  }
  std::shared_ptr<RemotePacks> remote(
      new RemotePacks(s3, std::move(loc), cache_dir, std::move(packs), options));
  return remote;
}

RemotePacks::RemotePacks(S3Client* s3, S3Location loc, fs::path cache_dir,
                         std::map<uint32_t, std::vector<PackSegment>> packs,
                         RemotePacksOptions options)
    : s3_(s3),
      loc_(std::move(loc)),
      cache_dir_(std::move(cache_dir)),
      options_(options),
      packs_(std::move(packs)) {
  for (int i = 0; i < std::max(1, options_.fetch_threads); ++i) {
    threads_.emplace_back([this] { FetchLoop(); });
  }
}

RemotePacks::~RemotePacks() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  queue_cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

uint64_t RemotePacks::held_bytes() const {
  MutexLock lock(mu_);
  return held_;
}

Status RemotePacks::AddPacks(const std::map<uint32_t, std::vector<PackSegment>>& packs) {
  MutexLock lock(packs_mu_);
  std::map<uint32_t, std::vector<PackSegment>> all = packs_;
  for (const auto& [id, segs] : packs) all[id] = segs;
  std::map<std::string, std::vector<PackSegment>> by_name;
  for (const auto& [id, segs] : all) by_name[PackFileName(id)] = segs;
  CKPTFS_RETURN_IF_ERROR(Record(cache_dir_, by_name));
  packs_ = std::move(all);
  return Status::OK();
}

std::vector<PackSegment> RemotePacks::Segments(uint32_t pack_id) const {
  MutexLock lock(packs_mu_);
  auto it = packs_.find(pack_id);
  return it == packs_.end() ? std::vector<PackSegment>() : it->second;
}

std::optional<PackSegment> RemotePacks::SegmentAt(uint32_t pack_id, uint64_t offset) const {
  MutexLock lock(packs_mu_);
  auto it = packs_.find(pack_id);
  if (it == packs_.end()) return std::nullopt;
  const std::vector<PackSegment>& segs = it->second;
  auto seg = std::upper_bound(segs.begin(), segs.end(), offset,
                              [](uint64_t off, const PackSegment& s) { return off < s.offset; });
  if (seg == segs.begin()) return std::nullopt;
  --seg;
  if (offset >= seg->offset + seg->length) return std::nullopt;
  return *seg;
}

bool RemotePacks::Holds(uint32_t pack_id, uint64_t offset, uint64_t length) const {
  MutexLock lock(packs_mu_);
  auto it = packs_.find(pack_id);
  if (it == packs_.end() || it->second.empty()) return false;
  const PackSegment& last = it->second.back();
  return offset + length <= last.offset + last.length;
}

Result<Buffer> RemotePacks::Fetch(const PackSegment& seg, uint64_t offset, uint64_t length) const {
  CKPTFS_ASSIGN_OR_RETURN(Buffer got, s3_->GetRange(loc_.bucket, loc_.Key("objects/" + seg.sha256),
                                                    offset - seg.offset, length));
  gets_.fetch_add(1, std::memory_order_relaxed);
  fetched_bytes_.fetch_add(got.size(), std::memory_order_relaxed);
  if (got.size() != length) {
    return Status::Corruption("segment " + seg.sha256 + " in the bucket is shorter than " +
                              "its manifest says");
  }
  return got;
}

RemotePacks::Fetched RemotePacks::FetchRun(const PackSegment& seg, uint64_t begin,
                                           uint64_t end) const {
  CKPTFS_ASSIGN_OR_RETURN(Buffer got, Fetch(seg, begin, end - begin));
  return std::shared_ptr<const Buffer>(std::make_shared<Buffer>(std::move(got)));
}

Status RemotePacks::Read(uint32_t pack_id, uint64_t offset, MutableBytes header,
                         MutableBytes payload) const {
  const uint64_t end = offset + header.size() + payload.size();
  for (uint64_t pos = offset; pos < end;) {
    // A prefetched run holding pos, else the first run after it (where a direct read stops).
    std::shared_future<Fetched> run_data;
    uint64_t run_begin = 0, run_end = 0, run_order = 0, next_run = end;
    {
      MutexLock lock(mu_);
      auto it = runs_.upper_bound({pack_id, pos});
      if (it != runs_.end() && it->first.first == pack_id) next_run = it->first.second;
      if (it != runs_.begin()) {
        --it;
        if (it->first.first == pack_id && pos < it->second.end) {
          run_data = it->second.data;
          run_begin = it->first.second;
          run_end = it->second.end;
          run_order = it->second.order;
        }
      }
    }
    if (run_data.valid() &&
        run_data.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      // Still queued: this reader fetches it now rather than wait for a fetch thread.
      std::optional<Job> job;
      {
        MutexLock lock(mu_);
        job = TakeQueued(pack_id, run_begin);
      }
      if (job) job->done->set_value(FetchRun(job->seg, job->begin, job->end));
    }
    if (run_data.valid()) {
      const Fetched& run = run_data.get();
      const uint64_t stop = std::min(end, run_end);
      if (run.ok()) {
        Scatter((*run)->bytes().subspan(pos - run_begin, stop - pos), pos - offset, header,
                payload);
      }
      MutexLock lock(mu_);
      auto it = runs_.find({pack_id, run_begin});
      if (it != runs_.end() && it->second.order == run_order) {  // not evicted meanwhile
        // Dropped once all its bytes were read, or when its fetch failed (a direct read
        // below reports the error, or succeeds where the prefetch did not).
        Run& r = it->second;
        r.unread -= std::min(r.unread, stop - pos);
        if (r.unread == 0 || !run.ok()) {
          held_ -= r.end - it->first.second;
          runs_.erase(it);
        }
      }
      if (run.ok()) {
        pos = stop;
        continue;
      }
    }
    // Not prefetched: a ranged GET up to the segment's end or the next run, whichever first.
    const std::optional<PackSegment> seg = SegmentAt(pack_id, pos);
    if (!seg) {
      return Status::Corruption("the bucket's segments of pack " + PackFileName(pack_id) +
                                " do not hold offset " + std::to_string(pos));
    }
    uint64_t stop = std::min(end, seg->offset + seg->length);
    if (next_run > pos) stop = std::min(stop, next_run);
    CKPTFS_ASSIGN_OR_RETURN(Buffer piece, Fetch(*seg, pos, stop - pos));
    Scatter(piece.bytes(), pos - offset, header, payload);
    pos = stop;
  }
  return Status::OK();
}

bool RemotePacks::MakeRoom(uint64_t bytes) const {
  while (held_ + bytes > options_.prefetch_bytes) {
    auto oldest = runs_.end();
    for (auto it = runs_.begin(); it != runs_.end(); ++it) {
      const bool ready =
          it->second.data.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      if (ready && (oldest == runs_.end() || it->second.order < oldest->second.order)) oldest = it;
    }
    if (oldest == runs_.end()) return false;  // all in flight: no room now
    held_ -= oldest->second.end - oldest->first.second;
    runs_.erase(oldest);
  }
  return true;
}

bool RemotePacks::Covered(uint32_t pack_id, uint64_t offset, uint64_t end) const {
  auto it = runs_.upper_bound({pack_id, offset});
  if (it != runs_.end() && it->first.first == pack_id && it->first.second < end) return true;
  if (it == runs_.begin()) return false;
  --it;
  return it->first.first == pack_id && offset < it->second.end;
}

void RemotePacks::WillNeed(std::vector<RecordRange> records) const {
  std::sort(records.begin(), records.end(), [](const RecordRange& a, const RecordRange& b) {
    return std::tie(a.pack_id, a.offset) < std::tie(b.pack_id, b.offset);
  });
  struct Planned {
    PackSegment seg;
    uint32_t pack = 0;
    uint64_t begin = 0, end = 0, bytes = 0;
  };
  std::vector<Planned> plan;
  MutexLock lock(mu_);
  for (const RecordRange& r : records) {
    // A record that spans two segments is a piece of a run in each.
    for (uint64_t pos = r.offset, end = r.offset + r.length; pos < end;) {
      const std::optional<PackSegment> seg = SegmentAt(r.pack_id, pos);
      if (!seg) break;  // read (and reported) when it is needed
      const uint64_t stop = std::min(end, seg->offset + seg->length);
      const uint64_t begin = pos;
      pos = stop;
      if (Covered(r.pack_id, begin, stop)) continue;
      if (!plan.empty()) {
        Planned& cur = plan.back();
        if (cur.seg.offset == seg->offset && cur.seg.sha256 == seg->sha256 && begin >= cur.end &&
            begin - cur.end <= kRunGap && stop - cur.begin <= options_.run_bytes &&
            !Covered(r.pack_id, cur.end, stop)) {
          cur.end = stop;
          cur.bytes += stop - begin;
          continue;
        }
      }
      plan.push_back({*seg, r.pack_id, begin, stop, stop - begin});
    }
  }
  const size_t wanted = plan.size();  // the window's runs; the read-ahead's follow
  // Read-ahead: a checkpoint's records lie in its pack in the order they are read, so the
  // pack bytes after the window are fetched too (up to read_ahead_bytes past it, in runs,
  // skipping what runs hold already).
  if (!records.empty() && options_.read_ahead_bytes > 0) {
    const RecordRange& last = records.back();  // the window's end (sorted)
    const uint32_t pack = last.pack_id;
    const uint64_t limit = last.offset + last.length + options_.read_ahead_bytes;
    for (uint64_t pos = last.offset + last.length; pos < limit;) {
      const std::optional<PackSegment> seg = SegmentAt(pack, pos);
      if (!seg) break;  // the end of the pack
      uint64_t stop = std::min({limit, seg->offset + seg->length, pos + options_.run_bytes});
      auto next = runs_.upper_bound({pack, pos});
      if (Covered(pack, pos, pos + 1)) {  // skip to where that run ends
        pos = std::prev(next)->second.end;
        continue;
      }
      if (next != runs_.end() && next->first.first == pack) {
        stop = std::min(stop, next->first.second);
      }
      plan.push_back({*seg, pack, pos, stop, stop - pos});
      pos = stop;
    }
  }
  size_t queued = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Planned& p = plan[i];
    // The window's runs may evict the oldest fetched runs; read-ahead never does (it would
    // evict bytes the reader needs sooner than its own): the rest is read when it is needed.
    if (i < wanted ? !MakeRoom(p.end - p.begin)
                   : held_ + (p.end - p.begin) > options_.prefetch_bytes) {
      break;
    }
    auto done = std::make_shared<std::promise<Fetched>>();
    runs_[{p.pack, p.begin}] = Run{p.end, done->get_future().share(), p.bytes, ++next_order_};
    held_ += p.end - p.begin;
    (i < wanted ? wanted_ : ahead_).push_back({p.seg, p.pack, p.begin, p.end, std::move(done)});
    ++queued;
  }
  lock.Unlock();
  for (size_t i = 0; i < queued; ++i) queue_cv_.NotifyOne();
}

std::optional<RemotePacks::Job> RemotePacks::TakeQueued(uint32_t pack_id, uint64_t begin) const {
  for (std::deque<Job>* queue : {&wanted_, &ahead_}) {
    for (auto it = queue->begin(); it != queue->end(); ++it) {
      if (it->pack == pack_id && it->begin == begin) {
        Job job = std::move(*it);
        queue->erase(it);
        return job;
      }
    }
  }
  return std::nullopt;
}

void RemotePacks::FetchLoop() const {
  MutexLock lock(mu_);
  for (;;) {
    while (wanted_.empty() && ahead_.empty() && !stopping_) queue_cv_.Wait(lock);
    std::deque<Job>& queue = wanted_.empty() ? ahead_ : wanted_;
    if (queue.empty()) return;
    Job job = std::move(queue.front());
    queue.pop_front();
    if (stopping_) {
      job.done->set_value(Status::Busy("the store is closing"));
      continue;
    }
    lock.Unlock();
    Fetched got = FetchRun(job.seg, job.begin, job.end);
    if (!got.ok()) {
      spdlog::warn("prefetch of segment {} (pack bytes {}-{}): {}", job.seg.sha256, job.begin,
                   job.end, got.status().ToString());
    }
    job.done->set_value(std::move(got));
    lock.Lock();
  }
}

}  // namespace ckptfs::objstore
