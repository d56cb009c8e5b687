// engine/namespace/control_protocol.h
//
// Framing of the mount daemon's control socket (STORE/control.sock; protocol in
// docs/snapshot.md): each message is a 4-byte little-endian length followed by that many bytes
// of UTF-8 JSON. Used by the daemon (control_server.h) and by the snapshot engine's client
// (engine/snapshot/sink.h). The requests are encoded and decoded here, once:
//
//   CKPTFS_RETURN_IF_ERROR(SendFrame(fd, EncodeControlRequest(request)));
//   CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> frame, RecvFrame(fd));  // nullopt: EOF
//   CKPTFS_ASSIGN_OR_RETURN(ControlRequest decoded, DecodeControlRequest(*frame));
//
// A peer's bytes are untrusted: every length and number is bounded before use, and anything
// else is InvalidArgument (a request) or Corruption (a frame). tests/fuzz/control_protocol_fuzz.cc
// fuzzes both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/hash/chunk_id.h"
#include "engine/util/status.h"

namespace ckptfs {

// Bounded so that a confused peer cannot make the other side allocate gigabytes.
inline constexpr uint32_t kMaxControlFrameBytes = 256u << 20;
inline constexpr char kControlSocketName[] = "control.sock";

// The most ranks of one sharded version.
inline constexpr uint32_t kMaxControlWorldSize = 65536;

Status SendFrame(int fd, std::string_view message);
// The next message; nullopt when the peer closed the connection between messages.
Result<std::optional<std::string>> RecvFrame(int fd);

// One chunk of a rank's file, in file order.
struct CommitChunk {
  ChunkId id;
  uint32_t raw_len = 0;
  bool stored = false;  // false: a reference to a chunk the store already holds
  uint64_t offset = 0;  // stored: the record in the reserved pack
  uint32_t length = 0;  // stored: header + payload
};

// A rank's commit: its file, the pack it wrote and the chunks that make up the file.
struct RankCommit {
  std::string file_name;  // rank_R.safetensors
  uint64_t size = 0;
  uint32_t pack_id = 0;
  uint64_t pack_length = 0;  // bytes of the pack written, its header included
  std::vector<CommitChunk> chunks;
  std::string shard_json;  // this rank's part of manifest.json (a JSON object)
};

struct ControlRequest {
  enum class Op { kBegin, kReservePack, kCommit, kAdmin };
  Op op = Op::kReservePack;
  // kBegin: rank < world_size <= kMaxControlWorldSize.
  std::string version;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  // kCommit.
  RankCommit commit;
  // kAdmin: the whole request, a JSON object with "cmd" (admin.h decodes the rest), and
  // whether it asks for progress frames before the reply ("progress": true).
  std::string admin_json;
  bool admin_progress = false;
};

// The commit request (also what the snapshot engine's directory sink writes). A shard_json
// that is not a JSON object is sent as {}.
std::string EncodeCommit(const RankCommit& commit);
std::string EncodeControlRequest(const ControlRequest& request);
// InvalidArgument, saying what is wrong, for anything but a well-formed request.
Result<ControlRequest> DecodeControlRequest(std::string_view message);

}  // namespace ckptfs
