// engine/store/remote_records.h
//
// The seam through which a store reads records that are not on its local disk: a store whose
// packs live elsewhere (an S3 bucket: engine/objstore/remote_packs.h) hands one to the store
// (StoreOptions::remote_records), and the chunk reader asks it for the records it holds instead
// of reading the pack file.
//
// Contract for implementations:
// - Holds() is a pure function of its arguments for the implementation's lifetime (a record
//   is remote or it is not; the store never writes into a range it holds).
// - Read() fills both spans with exactly the bytes of the pack at `offset`, or fails. The
//   bytes are not trusted: the chunk reader checks the record they form (header checksum,
//   catalog row, payload checksum) as it checks a local read, so damage reads as Corruption.
// - WillNeed() is advisory (a prefetch window): it may start fetches now so that the Read()s
//   that follow find the bytes; errors are left for those reads to report.
// - Memory held for prefetched bytes is bounded by the implementation's configuration.
// Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/util/buffer.h"
#include "engine/util/status.h"

namespace ckptfs {

// A record's place in a pack file.
struct RecordRange {
  uint32_t pack_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class RemoteRecords {
 public:
  virtual ~RemoteRecords() = default;
  // True when the bytes [offset, offset + length) of the pack are read through this source.
  virtual bool Holds(uint32_t pack_id, uint64_t offset, uint64_t length) const = 0;
  // Reads header.size() + payload.size() bytes at `offset` of the pack into the two spans.
  // REQUIRES: Holds(pack_id, offset, header.size() + payload.size()).
  virtual Status Read(uint32_t pack_id, uint64_t offset, MutableBytes header,
                      MutableBytes payload) const = 0;
  // These records will be read soon. REQUIRES: Holds() each of them.
  virtual void WillNeed(std::vector<RecordRange> records) const = 0;
};

}  // namespace ckptfs
