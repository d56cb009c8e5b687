// engine/namespace/control_protocol.h
//
// Framing of the mount daemon's control socket (STORE/control.sock; protocol in
// docs/snapshot.md): each message is a 4-byte little-endian length followed by that many bytes
// of UTF-8 JSON. Used by the daemon (control_server.h) and by the snapshot engine's client
// (engine/snapshot/sink.h).
//
//   CKPTFS_RETURN_IF_ERROR(SendFrame(fd, R"({"op":"reserve_pack"})"));
//   CKPTFS_ASSIGN_OR_RETURN(std::optional<std::string> reply, RecvFrame(fd));  // nullopt: EOF
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "engine/util/status.h"

namespace ckptfs {

// Bounded so that a confused peer cannot make the other side allocate gigabytes.
inline constexpr uint32_t kMaxControlFrameBytes = 256u << 20;
inline constexpr char kControlSocketName[] = "control.sock";

Status SendFrame(int fd, std::string_view message);
// The next message; nullopt when the peer closed the connection between messages.
Result<std::optional<std::string>> RecvFrame(int fd);

}  // namespace ckptfs
