#include "fs/mount_options.h"

#include <array>
#include <charconv>
#include <cmath>

namespace ckptfs {
namespace {

Result<double> ParseSeconds(std::string_view key, std::string_view text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 0) {
    return Status::InvalidArgument("bad -o " + std::string(key) + "=" + std::string(text) +
                                   ": seconds expected");
  }
  return v;
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// Options that mount(8), fstab and systemd use and the filesystem never sees.
bool ForMountOnly(std::string_view key) {
  static constexpr std::array<std::string_view, 10> kKeys = {
      "defaults", "auto",  "noauto", "user",   "nouser",
      "users",    "owner", "group",  "nofail", "_netdev"};
  for (auto k : kKeys) {
    if (key == k) return true;
  }
  return key == "comment" || key.starts_with("x-");
}

Status ApplyOne(std::string_view option, MountArgs* args) {
  size_t eq = option.find('=');
  std::string_view key = option.substr(0, eq);
  std::string_view value = eq == std::string_view::npos ? "" : option.substr(eq + 1);
  bool has_value = eq != std::string_view::npos;
  auto need_value = [&]() -> Status {
    if (has_value && !value.empty()) return Status::OK();
    return Status::InvalidArgument("-o " + std::string(key) + " needs a value (" +
                                   std::string(key) + "=...)");
  };
  if (key == "cache_size" || key == "inflight") {
    if (Status s = need_value(); !s.ok()) return s;
    auto bytes = ParseSize(value);
    if (!bytes.ok()) return bytes.status();
    (key == "cache_size" ? args->cache_bytes : args->inflight_bytes) = *bytes;
  } else if (key == "codec") {
    if (Status s = need_value(); !s.ok()) return s;
    auto spec = CodecSpec::Parse(value);
    if (!spec.ok()) return spec.status();
    args->codec = *spec;
  } else if (key == "delta_chain") {
    if (Status s = need_value(); !s.ok()) return s;
    uint32_t n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || n < 1 || n > 64) {
      return Status::InvalidArgument("bad -o delta_chain=" + std::string(value) + ": 1..64");
    }
    args->max_delta_chain = n;
  } else if (key == "seal_after" || key == "snapshot_timeout") {
    if (Status s = need_value(); !s.ok()) return s;
    auto seconds = ParseSeconds(key, value);
    if (!seconds.ok()) return seconds.status();
    if (key == "seal_after") {
      args->seal_after = Millis(*seconds);
    } else {
      if (*seconds <= 0) return Status::InvalidArgument("-o snapshot_timeout must be positive");
      args->snapshot_timeout = Millis(*seconds);
    }
  } else if (key == "prometheus") {
    if (Status s = need_value(); !s.ok()) return s;
    uint16_t port = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), port);
    if (ec != std::errc() || end != value.data() + value.size() || port == 0) {
      return Status::InvalidArgument("bad -o prometheus=" + std::string(value) +
                                     ": a TCP port, 1..65535");
    }
    args->prometheus_port = port;
  } else if (key == "keep_last" || key == "keep_every") {
    if (Status s = need_value(); !s.ok()) return s;
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || (key == "keep_last" && n < 1)) {
      return Status::InvalidArgument("bad -o " + std::string(key) + "=" + std::string(value) +
                                     ": a whole number" +
                                     (key == "keep_last" ? ", at least 1" : ""));
    }
    (key == "keep_last" ? args->keep_last : args->keep_every) = n;
  } else if (key == "control_group") {
    if (Status s = need_value(); !s.ok()) return s;
    args->control_group = std::string(value);
  } else if (key == "create" && !has_value) {
    args->create = true;
  } else if (key == "forward_deltas" && !has_value) {
    args->reverse_deltas = false;
  } else if (key == "compress_at_write" && !has_value) {
    args->compress_behind = false;
  } else if (!ForMountOnly(key)) {
    args->fuse_options.emplace_back(option);
  }
  return Status::OK();
}

}  // namespace

Result<size_t> ParseSize(std::string_view text) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  if (ec != std::errc() || end == text.data()) {
    return Status::InvalidArgument("bad size '" + std::string(text) + "': use e.g. 128M, 2G or 1T");
  }
  unsigned shift = 0;
  if (unit == "K" || unit == "k") {
    shift = 10;
  } else if (unit == "M" || unit == "m") {
    shift = 20;
  } else if (unit == "G" || unit == "g") {
    shift = 30;
  } else if (unit == "T" || unit == "t") {
    shift = 40;
  } else if (!unit.empty()) {
    return Status::InvalidArgument("bad size unit in '" + std::string(text) + "': K, M, G or T");
  }
  if (v > (SIZE_MAX >> shift)) {
    return Status::InvalidArgument("size '" + std::string(text) + "' is too large");
  }
  return static_cast<size_t>(v) << shift;
}

Status ApplyMountOptions(std::string_view list, MountArgs* args) {
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view option = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (option.empty()) continue;
    if (Status s = ApplyOne(option, args); !s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace ckptfs
