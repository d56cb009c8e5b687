// engine/snapshot/record_chain.h
//
// The snapshot engine's delta bases, read back in the training process. Each chunk the engine
// stored is a StoredRecord: where its record lies in a pack and, for a delta, the record of
// its base. The next snapshot's changed block is encoded against the previous snapshot's chunk
// of the same block, whose raw bytes PackReader rebuilds from those records, without the
// daemon or its catalog:
//
//   PackReader reader(pack.path.parent_path());
//   CKPTFS_ASSIGN_OR_RETURN(Buffer base, reader.Read(*previous_block_record));
//
// Every record on the chain is checked (header, payload checksum, id, length, the base it
// names) and the result's SHA-256 must be the chunk's id: a pack gc has rewritten or deleted
// since reads as an error (the caller stores the block without a delta), never as wrong bytes.
// Memory: one record and two chunk buffers at a time, whatever the chain's length.
// Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <unordered_map>

#include "engine/hash/chunk_id.h"
#include "engine/util/buffer.h"
#include "engine/util/file.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs::snapshot {

struct StoredRecord {
  ChunkId id;
  uint32_t raw_len = 0;
  uint32_t pack_id = 0;
  uint64_t offset = 0;  // of the record header in the pack
  uint32_t length = 0;  // header + payload
  uint32_t depth = 1;   // records decoded to rebuild the chunk: 1 + the base's depth
  std::shared_ptr<const StoredRecord> base;  // the delta base; null for a whole record
};

class PackReader {
 public:
  explicit PackReader(std::filesystem::path pack_dir) : dir_(std::move(pack_dir)) {}

  // The raw bytes of the chunk `record` stores.
  Result<Buffer> Read(const StoredRecord& record);

 private:
  Result<std::shared_ptr<FileDescriptor>> Fd(uint32_t pack_id);

  const std::filesystem::path dir_;
  Mutex mu_;
  std::unordered_map<uint32_t, std::shared_ptr<FileDescriptor>> fds_ GUARDED_BY(mu_);
};

}  // namespace ckptfs::snapshot
