// engine/snapshot/sink.h
//
// Where a snapshot's records and commit go. The daemon sink talks to the mount daemon over its
// control socket (docs/snapshot.md, "Protocol"): the daemon reserves pack ids, checks the
// records this process wrote, and publishes the version once every rank committed. The
// directory sink writes packs into a plain directory and the commit as JSON beside them (unit
// tests and the device benchmark, where no daemon runs).
//
//   CKPTFS_ASSIGN_OR_RETURN(auto sink, ConnectDaemon("/data/ckpt/control.sock"));
//   CKPTFS_RETURN_IF_ERROR(sink->Begin("global_step100", rank, world_size));
//   CKPTFS_ASSIGN_OR_RETURN(PackTarget pack, sink->ReservePack());   // write records there
//   CKPTFS_RETURN_IF_ERROR(sink->Commit(commit));                    // this rank's part accepted
//   CKPTFS_RETURN_IF_ERROR(sink->WaitComplete());                    // the version is visible
//
// Thread-compatible: one snapshot at a time drives a sink.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/hash/chunk_id.h"
#include "engine/namespace/control_protocol.h"
#include "engine/util/status.h"

namespace ckptfs::snapshot {

struct PackTarget {
  uint32_t pack_id = 0;
  std::filesystem::path path;  // exists, with its pack header; records go from byte 32 on
};

// The commit of a rank (engine/namespace/control_protocol.h, where it is encoded and decoded).
using ckptfs::CommitChunk;
using ckptfs::EncodeCommit;
using ckptfs::RankCommit;

class PersistSink {
 public:
  virtual ~PersistSink() = default;
  virtual Status Begin(const std::string& version, int rank, int world_size) = 0;
  virtual Result<PackTarget> ReservePack() = 0;
  // Returns once the rank's part is accepted (its records checked).
  virtual Status Commit(const RankCommit& commit) = 0;
  // Returns once the version is visible (every rank committed), or why it never will be.
  virtual Status WaitComplete() = 0;
  // After Begin: the longest delta chain the store accepts (1: no deltas).
  virtual uint32_t max_delta_chain() const = 0;
};

Result<std::unique_ptr<PersistSink>> ConnectDaemon(const std::filesystem::path& socket);
std::unique_ptr<PersistSink> NewDirSink(const std::filesystem::path& dir);

}  // namespace ckptfs::snapshot
