#include "engine/namespace/control_protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {

using nlohmann::json;

constexpr size_t kRecvStepBytes = 1 << 20;

bool GetUint(const json& j, const char* key, uint64_t max, uint64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  *out = it->get<uint64_t>();
  return *out <= max;
}

bool GetString(const json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

// Compact JSON; a string that is not UTF-8 (a caller's version name) gets U+FFFD, never an
// exception.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64 = std::numeric_limits<uint64_t>::max();

Status DecodeCommit(const json& req, RankCommit* c) {
  uint64_t pack_id = 0;
  if (!GetString(req, "file", &c->file_name) || !GetUint(req, "size", kU64, &c->size) ||
      !GetUint(req, "pack_id", kU32, &pack_id) ||
      !GetUint(req, "pack_length", kU64, &c->pack_length)) {
    return Status::InvalidArgument("commit needs file, size, pack_id (< 2^32), pack_length");
  }
  c->pack_id = static_cast<uint32_t>(pack_id);
  auto chunks = req.find("chunks");
  auto shard = req.find("shard");
  if (chunks == req.end() || !chunks->is_array() || shard == req.end() || !shard->is_object()) {
    return Status::InvalidArgument("commit needs chunks (an array) and shard (an object)");
  }
  c->shard_json = Dump(*shard);
  c->chunks.reserve(chunks->size());
  for (const json& e : *chunks) {
    CommitChunk chunk;
    if (!e.is_array() || (e.size() != 2 && e.size() != 4) || !e[0].is_string() ||
        !ChunkId::FromHex(e[0].get<std::string>(), &chunk.id) || !e[1].is_number_unsigned() ||
        e[1].get<uint64_t>() > kU32) {
      return Status::InvalidArgument(
          "malformed chunk entry in commit (want [id, raw_len] or [id, raw_len, offset, "
          "length], raw_len and length < 2^32)");
    }
    chunk.raw_len = static_cast<uint32_t>(e[1].get<uint64_t>());
    if (e.size() == 4) {
      if (!e[2].is_number_unsigned() || !e[3].is_number_unsigned() ||
          e[3].get<uint64_t>() > kU32) {
        return Status::InvalidArgument("malformed chunk location in commit");
      }
      chunk.stored = true;
      chunk.offset = e[2].get<uint64_t>();
      chunk.length = static_cast<uint32_t>(e[3].get<uint64_t>());
    }
    c->chunks.push_back(chunk);
  }
  return Status::OK();
}

Status SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "send on the control socket");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// Returns false on EOF before the first byte.
Result<bool> RecvAll(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "recv on the control socket");
    }
    if (r == 0) {
      if (got == 0) return false;
      return Status::IOError("the control connection closed in the middle of a message");
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

Status SendFrame(int fd, std::string_view message) {
  if (message.size() > kMaxControlFrameBytes) {
    return Status::InvalidArgument("control message of " + std::to_string(message.size()) +
                                   " bytes is too large");
  }
  std::byte len[4];
  PutLE<uint32_t>(len, static_cast<uint32_t>(message.size()));
  CKPTFS_RETURN_IF_ERROR(SendAll(fd, reinterpret_cast<const char*>(len), 4));
  return SendAll(fd, message.data(), message.size());
}

Result<std::optional<std::string>> RecvFrame(int fd) {
  std::byte len[4];
  CKPTFS_ASSIGN_OR_RETURN(bool any, RecvAll(fd, reinterpret_cast<char*>(len), 4));
  if (!any) return std::optional<std::string>();
  uint32_t n = GetLE<uint32_t>(len);
  if (n > kMaxControlFrameBytes) {
    return Status::Corruption("control message announces " + std::to_string(n) + " bytes");
  }
  // The body grows as it arrives: 4 bytes announcing 256 MiB cost nothing until they come.
  std::string msg;
  while (msg.size() < n) {
    const size_t at = msg.size();
    const size_t step = std::min<size_t>(n - at, kRecvStepBytes);
    msg.resize(at + step);
    CKPTFS_ASSIGN_OR_RETURN(bool body, RecvAll(fd, msg.data() + at, step));
    if (!body) return Status::IOError("the control connection closed in the middle of a message");
  }
  return std::optional<std::string>(std::move(msg));
}

std::string EncodeCommit(const RankCommit& c) {
  json chunks = json::array();
  for (const CommitChunk& ch : c.chunks) {
    if (ch.stored) {
      chunks.push_back(json::array({ch.id.Hex(), ch.raw_len, ch.offset, ch.length}));
    } else {
      chunks.push_back(json::array({ch.id.Hex(), ch.raw_len}));
    }
  }
  json shard = json::parse(c.shard_json, nullptr, /*allow_exceptions=*/false);
  if (!shard.is_object()) shard = json::object();
  json msg = {{"op", "commit"},       {"file", c.file_name},          {"size", c.size},
              {"pack_id", c.pack_id}, {"pack_length", c.pack_length}, {"chunks", chunks},
              {"shard", shard}};
  return Dump(msg);
}

std::string EncodeControlRequest(const ControlRequest& r) {
  switch (r.op) {
    case ControlRequest::Op::kBegin:
      return Dump(
          {{"op", "begin"}, {"version", r.version}, {"rank", r.rank}, {"world_size", r.world_size}});
    case ControlRequest::Op::kReservePack:
      return Dump({{"op", "reserve_pack"}});
    case ControlRequest::Op::kCommit:
      return EncodeCommit(r.commit);
    case ControlRequest::Op::kAdmin: {
      json req = json::parse(r.admin_json, nullptr, /*allow_exceptions=*/false);
      if (!req.is_object()) req = json::object();
      req["op"] = "admin";
      if (r.admin_progress) req["progress"] = true;
      return Dump(req);
    }
  }
  return "";
}

Result<ControlRequest> DecodeControlRequest(std::string_view message) {
  json req = json::parse(message, nullptr, /*allow_exceptions=*/false);
  ControlRequest r;
  std::string op;
  if (!req.is_object() || !GetString(req, "op", &op)) {
    return Status::InvalidArgument("a control request is a JSON object with an op");
  }
  if (op == "begin") {
    uint64_t rank = 0, world = 0;
    if (!GetString(req, "version", &r.version) ||
        !GetUint(req, "world_size", kMaxControlWorldSize, &world) || world == 0 ||
        !GetUint(req, "rank", world - 1, &rank)) {
      return Status::InvalidArgument("begin needs version, rank < world_size <= " +
                                     std::to_string(kMaxControlWorldSize));
    }
    r.op = ControlRequest::Op::kBegin;
    r.rank = static_cast<uint32_t>(rank);
    r.world_size = static_cast<uint32_t>(world);
    return r;
  }
  if (op == "reserve_pack") {
    r.op = ControlRequest::Op::kReservePack;
    return r;
  }
  if (op == "commit") {
    r.op = ControlRequest::Op::kCommit;
    CKPTFS_RETURN_IF_ERROR(DecodeCommit(req, &r.commit));
    return r;
  }
  if (op == "admin") {
    auto progress = req.find("progress");
    if (progress != req.end() && !progress->is_boolean()) {
      return Status::InvalidArgument("admin: progress must be true or false");
    }
    r.op = ControlRequest::Op::kAdmin;
    r.admin_progress = progress != req.end() && progress->get<bool>();
    r.admin_json = Dump(req);
    return r;
  }
  return Status::InvalidArgument("unknown op " + op);
}

}  // namespace ckptfs
