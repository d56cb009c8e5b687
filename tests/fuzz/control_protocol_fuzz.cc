// libFuzzer target for the mount daemon's control protocol (engine/namespace/control_protocol.h):
// the bytes a peer sends on STORE/control.sock. Each input is read twice:
//   - as a stream of frames (4-byte length + message) through a socket pair, as the daemon
//     reads it: RecvFrame must return whole frames whose lengths add up to at most the input,
//     or an error, never more; each frame is decoded as a request;
//   - as one request (the JSON alone), so that mutations of the JSON are read even when they
//     break the framing.
// A decoded request must hold its bounds (rank < world_size <= kMaxControlWorldSize, ...) and
// survive a round trip: decoding its encoding gives a request that encodes the same.
// Built by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/namespace/control_protocol.h"

namespace {

using ckptfs::ControlRequest;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "control_protocol_fuzz: %s\n", what);
  std::abort();
}

void Decode(std::string_view message) {
  ckptfs::Result<ControlRequest> r = ckptfs::DecodeControlRequest(message);
  if (!r.ok()) {
    Check(r.status().code() == ckptfs::Status::Code::kInvalidArgument, "a status other than InvalidArgument");
    return;
  }
  if (r->op == ControlRequest::Op::kBegin) {
    Check(r->world_size > 0 && r->world_size <= ckptfs::kMaxControlWorldSize &&
              r->rank < r->world_size,
          "begin out of bounds");
  }
  if (r->op == ControlRequest::Op::kCommit) {
    Check(r->commit.shard_json.size() >= 2 && r->commit.shard_json.front() == '{',
          "commit's shard is not an object");
  }
  const std::string wire = ckptfs::EncodeControlRequest(*r);
  ckptfs::Result<ControlRequest> again = ckptfs::DecodeControlRequest(wire);
  Check(again.ok(), "a decoded request's encoding does not decode");
  Check(again->op == r->op, "the round trip changed the op");
  Check(ckptfs::EncodeControlRequest(*again) == wire, "the round trip changed the request");
}

// Feeds `data` through a socket pair (the input is at most -max_len, well under the socket's
// buffer) and reads frames until EOF or an error.
void Frames(const uint8_t* data, size_t size) {
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  int sndbuf = 1 << 20;
  ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  size_t off = 0;
  while (off < size) {
    ssize_t w = ::write(fds[1], data + off, size - off);
    Check(w > 0, "write to the socket pair");
    off += static_cast<size_t>(w);
  }
  ::close(fds[1]);
  size_t consumed = 0;
  for (;;) {
    auto frame = ckptfs::RecvFrame(fds[0]);
    if (!frame.ok() || !*frame) break;
    consumed += 4 + (*frame)->size();
    Check(consumed <= size, "frames longer than the input");
    Decode(**frame);
  }
  ::close(fds[0]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Frames(data, size);
  Decode(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
