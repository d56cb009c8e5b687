#include "engine/store/read_progress.h"

#include <algorithm>

namespace ckptfs {

void ReadProgress::Passed(uint64_t offset) {
  MutexLock lock(mu_);
  if (offset < passed_) {
    finished_.clear();  // started over: what it finished before, it wants again
  } else {
    std::erase_if(finished_, [&](const auto& f) { return f.second <= offset; });
  }
  passed_ = offset;
}

void ReadProgress::Finished(const ChunkId& id, uint64_t end) {
  MutexLock lock(mu_);
  if (end <= passed_) return;
  if (finished_.size() >= kMaxFinished) finished_.erase(finished_.begin());
  finished_.emplace_back(id, end);
}

bool ReadProgress::Wants(const ChunkId& id, uint64_t end) const {
  MutexLock lock(mu_);
  if (end <= passed_) return false;
  return std::none_of(finished_.begin(), finished_.end(),
                      [&](const auto& f) { return f.first == id; });
}

}  // namespace ckptfs
