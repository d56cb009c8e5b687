// fs/mount.h
//
// `ckptfs mount`: opens a store (creates it only when asked), mounts it with FUSE and serves
// requests until the filesystem is unmounted (fusermount3 -u, `ckptfs umount`, SIGTERM/SIGINT). On
// the way out every file that close() accepted is committed before the process exits.
//
// Without `foreground` the command forks a daemon and returns once the mount is ready (or
// with the daemon's error); the daemon logs to STORE/ckptfs.log (rotated at 16 MiB, three
// older files kept: ckptfs.1.log ... ckptfs.3.log).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "engine/codec/codec.h"
#include "engine/store/store.h"

namespace ckptfs {

struct MountArgs {
  std::string store;
  std::string mountpoint;
  bool foreground = false;
  // Create the store when STORE has none (`--create`, -o create); otherwise a missing store
  // fails the mount, so that a mistyped path does not make a new empty store.
  bool create = false;
  size_t cache_bytes = 256u << 20;
  size_t inflight_bytes = 256u << 20;
  std::optional<CodecSpec> codec;  // unset: the store's recorded codec (StoreOptions::codec)
  uint32_t max_delta_chain = StoreOptions{}.max_delta_chain;
  bool reverse_deltas = StoreOptions{}.reverse_deltas;  // --forward-deltas, -o forward_deltas
  // --compress-at-write, -o compress_at_write: false
  bool compress_behind = StoreOptions{}.compress_behind;
  std::chrono::milliseconds seal_after{std::chrono::seconds(10)};
  // Rotation as versions seal (engine/namespace/retention.h): keep the newest keep_last
  // versions (0: no rotation) and every keep_every-th from the oldest, forget the rest.
  uint64_t keep_last = 0;
  uint64_t keep_every = 0;
  // Prometheus text endpoint on 127.0.0.1:prometheus_port (metrics_endpoint.h); 0: off.
  uint16_t prometheus_port = 0;
  // A snapshot version whose ranks have not all committed this long after the first began is
  // abandoned (engine/namespace/control_server.h).
  std::chrono::milliseconds snapshot_timeout{std::chrono::minutes(30)};
  // A group whose members may use the control socket too (snapshots, ckptfs commands): e.g. a
  // non-root training job snapshotting into a daemon run by root. Empty: the daemon's user only.
  std::string control_group;
  std::vector<std::string> fuse_options;  // each as given to -o
  // The object store (docs/scale-out.md): with s3_location ("s3://BUCKET/PREFIX") set, `store`
  // is this node's cache directory, filled from the bucket when it holds no store, and fsync
  // and `ckptfs sync` return once the data is in the bucket.
  std::string s3_location;
  std::string s3_endpoint;  // empty: AWS_ENDPOINT_URL or the profile's endpoint_url
  std::string node;         // names this node's manifests; empty: the host name
  // Versions across nodes (engine/objstore/remote_versions.h): this node's rank among
  // world_size (0: it writes no version parts), and how often the bucket is polled for
  // versions that every rank committed.
  int rank = 0;
  int world_size = 0;
  std::chrono::milliseconds remote_poll{std::chrono::seconds(5)};
};

// Returns the process exit status.
int RunMount(const MountArgs& args);

}  // namespace ckptfs
