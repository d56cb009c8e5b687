// engine/objstore/s3_config.h
//
// Where an S3 store lives and how to reach it, resolved the way the AWS tools resolve it:
//
//   CKPTFS_ASSIGN_OR_RETURN(S3Location loc, ParseS3Location("s3://ckpts/run7"));
//   CKPTFS_ASSIGN_OR_RETURN(S3Config cfg, ResolveS3Config(/*endpoint=*/"", SystemEnvironment()));
//
// Credentials: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the
// profile AWS_PROFILE (default "default") of the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials). Endpoint: the argument, else
// AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else endpoint_url of the profile in the config
// file (AWS_CONFIG_FILE, default ~/.aws/config). Region: AWS_REGION, AWS_DEFAULT_REGION, the
// profile's region, else us-east-1. Secrets never appear in a Status message or a log line.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "engine/util/status.h"

namespace ckptfs::objstore {

// "s3://BUCKET/PREFIX": the bucket and the key prefix (no leading or trailing '/', may be
// empty) under which a store keeps its objects.
struct S3Location {
  std::string bucket;
  std::string prefix;
  // "s3://bucket/prefix".
  std::string ToString() const;
  // prefix + "/" + name, or name when the prefix is empty.
  std::string Key(std::string_view name) const;
};
Result<S3Location> ParseS3Location(std::string_view uri);
inline bool IsS3Uri(std::string_view s) { return s.starts_with("s3://"); }

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

struct S3RetryPolicy {
  int max_attempts = 6;  // the first try included
  std::chrono::milliseconds first_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
};

struct S3Config {
  std::string endpoint;  // "http://host:port" or "https://host"; no path
  std::string region = "us-east-1";
  S3Credentials credentials;
  S3RetryPolicy retry;
  std::chrono::milliseconds connect_timeout{5000};
  // A transfer slower than 1 KiB/s for this long is abandoned (and retried): no total timeout,
  // so large objects are never cut off while they progress.
  std::chrono::seconds stall_timeout{30};
  // Objects larger than this go up as multipart uploads of part_bytes parts (S3: >= 5 MiB).
  uint64_t multipart_threshold = uint64_t{64} << 20;
  uint64_t part_bytes = uint64_t{16} << 20;
};

// Looks a variable up; SystemEnvironment() reads the process environment.
using Environment = std::function<const char*(const char*)>;
Environment SystemEnvironment();

// REQUIRES: nothing. Returns InvalidArgument naming the missing piece (and how to give it) when
// no endpoint or no credentials can be found.
Result<S3Config> ResolveS3Config(std::string_view endpoint, const Environment& env);

}  // namespace ckptfs::objstore
