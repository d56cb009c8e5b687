// engine/objstore/s3_client.h
//
// A client of the S3 API (AWS S3, Ceph RGW, MinIO, ...) for immutable objects: path-style
// requests signed with SigV4 (sigv4.h), over libcurl.
//
//   CKPTFS_ASSIGN_OR_RETURN(S3Config cfg, ResolveS3Config(endpoint, SystemEnvironment()));
//   CKPTFS_ASSIGN_OR_RETURN(auto s3, S3Client::Open(cfg));
//   CKPTFS_RETURN_IF_ERROR(s3->Put("ckpts", "run7/packs/ab12...", bytes));
//   CKPTFS_ASSIGN_OR_RETURN(Buffer back, s3->Get("ckpts", "run7/packs/ab12..."));
//
// Guarantees:
// - Integrity: every upload is signed with its payload's SHA-256 (the server rejects a body
//   that changed on the way) and carries the SHA-256 of the whole object in its metadata
//   (x-amz-meta-ckptfs-sha256); Get() and GetFile() recompute it and return Corruption on a
//   mismatch that survives one re-download. A ranged read is checked for its length; the bytes
//   are checked by the caller (pack records carry their own checksums).
// - Retries: connection failures, stalled transfers (below 1 KiB/s for stall_timeout), HTTP 5xx,
//   429 and S3's SlowDown/RequestTimeout are retried up to retry.max_attempts times with
//   exponential backoff and full jitter; other errors return at once. A Put is atomic (S3
//   shows the whole object or nothing); a failed multipart upload is aborted (best effort: an
//   abort that fails leaves an incomplete upload, which AbortUploads() collects).
// - Memory: a Put or Get holds its object; PutFile() holds one part (part_bytes) at a time.
// - Secrets: the secret key and session token never appear in a Status or a log line.
// Thread-safe: calls may run concurrently (each borrows a connection from a pool).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/objstore/s3_config.h"
#include "engine/objstore/s3_xml.h"
#include "engine/util/buffer.h"
#include "engine/util/mutex.h"
#include "engine/util/status.h"

namespace ckptfs::objstore {

struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;           // without quotes
  std::string sha256;         // from x-amz-meta-ckptfs-sha256; empty for foreign objects
  int64_t last_modified = 0;  // seconds since the epoch
};

struct UploadEntry {
  std::string key;
  std::string upload_id;
  int64_t initiated = 0;  // seconds since the epoch
};

struct S3Stats {
  uint64_t requests = 0;  // HTTP requests sent, retries included
  uint64_t retries = 0;
  uint64_t bytes_sent = 0;      // request bodies
  uint64_t bytes_received = 0;  // response bodies
};

class S3Client {
 public:
  static Result<std::unique_ptr<S3Client>> Open(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Creates `bucket`; OK when it exists already and is ours.
  Status CreateBucket(std::string_view bucket);

  // Stores `data` as `key` (multipart above config.multipart_threshold). `sha256`, when the
  // caller has it already (a content-addressed key), is the hex SHA-256 of `data`: it is not
  // computed again, and a single-part upload signs it as the payload's hash, so the gateway
  // refuses the upload if it is not the hash of the bytes that arrived.
  Status Put(std::string_view bucket, std::string_view key, Bytes data,
             std::string_view sha256 = {});
  // Stores the file at `path` as `key`, one part in memory at a time.
  Status PutFile(std::string_view bucket, std::string_view key,
                 const std::filesystem::path& path);

  // The whole object, its checksum verified. NotFound when absent.
  Result<Buffer> Get(std::string_view bucket, std::string_view key);
  // The same for an object whose SHA-256 the caller knows (a content-addressed key): checked
  // against `sha256` (and against the stored checksum, which must agree with it).
  Result<Buffer> Get(std::string_view bucket, std::string_view key, std::string_view sha256);
  // Bytes [offset, offset + length) of the object; fewer only where the object ends.
  Result<Buffer> GetRange(std::string_view bucket, std::string_view key, uint64_t offset,
                          uint64_t length);
  // Size, ETag, checksum and age of the object. NotFound when absent.
  Result<ObjectInfo> Head(std::string_view bucket, std::string_view key);
  // Removes the object; OK when it is absent.
  Status Delete(std::string_view bucket, std::string_view key);

  // One page of ListObjectsV2 (keys in UTF-8 binary order); pass the page's
  // next_continuation_token to get the next one.
  Result<ListPage> ListOnePage(std::string_view bucket, std::string_view prefix,
                               std::string_view continuation_token, int max_keys = 1000);
  // Every object whose key starts with `prefix` (all pages).
  Result<std::vector<ObjectEntry>> List(std::string_view bucket, std::string_view prefix);

  // Multipart uploads started under `prefix` and not completed nor aborted.
  Result<std::vector<UploadEntry>> ListUploads(std::string_view bucket, std::string_view prefix);
  Status AbortUpload(std::string_view bucket, std::string_view key, std::string_view upload_id);

  S3Stats stats() const;
  const S3Config& config() const { return config_; }

  // Where the bytes of an upload come from (memory or a file); defined in s3_client.cc.
  class PartSource;

 private:
  struct Request;
  struct Response;
  class Connection;

  explicit S3Client(S3Config config);
  // Sends `req`, retrying transient failures; the response may be any HTTP status.
  Result<Response> Execute(const Request& req);
  Result<Response> SendOnce(Connection& conn, const Request& req);
  std::unique_ptr<Connection> Borrow();
  void Return(std::unique_ptr<Connection> conn);
  // Single PUT or multipart upload of `size` bytes read through `source`.
  Status Upload(std::string_view bucket, std::string_view key, uint64_t size,
                const std::string& sha256, PartSource& source);
  Status UploadMultipart(std::string_view bucket, std::string_view key, uint64_t size,
                         const std::string& sha256, PartSource& source);
  Result<Buffer> GetVerified(std::string_view bucket, std::string_view key,
                             std::string_view expected_sha256);

  const S3Config config_;
  const std::string host_;  // host[:port] of the endpoint, as the Host header carries it
  Mutex pool_mu_;
  std::vector<std::unique_ptr<Connection>> pool_ GUARDED_BY(pool_mu_);
  std::atomic<uint64_t> requests_{0}, retries_{0}, bytes_sent_{0}, bytes_received_{0};
};

// An s3://BUCKET/PREFIX store's location and a client for it: the URI parsed, the endpoint
// (`endpoint`, else AWS_ENDPOINT_URL) and credentials resolved from the process environment.
// What `ckptfs init`, `gc` and `mount` of an s3:// store start with.
struct S3Store {
  S3Location location;
  std::string endpoint;
  std::unique_ptr<S3Client> client;
};
Result<S3Store> OpenS3Store(std::string_view uri, std::string_view endpoint);

}  // namespace ckptfs::objstore
