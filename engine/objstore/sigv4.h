// engine/objstore/sigv4.h
//
// AWS Signature Version 4 for S3 requests (header-based authentication), as specified in
// https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html:
//
//   SigningRequest req{"GET", "/bucket/key", CanonicalQuery({{"list-type", "2"}}),
//                      {{"host", "127.0.0.1:7480"}, {"x-amz-date", date}, ...}, payload_hash};
//   std::string auth = Authorization(access_key, secret_key, "us-east-1", "s3", date, req);
//
// Pure functions of their arguments (no clock, no environment); thread-safe. The secret key
// only enters the HMAC chain: nothing here returns or logs it.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/util/buffer.h"

namespace ckptfs::objstore {

using Param = std::pair<std::string, std::string>;

// SHA-256 of `data`, as 64 lowercase hex digits (the form x-amz-content-sha256 carries).
std::string Sha256Hex(Bytes data);
// The SHA-256 of no bytes.
inline constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// RFC 3986 percent-encoding the S3 way: A-Z a-z 0-9 - . _ ~ stay, every other byte becomes
// %XX (upper-case hex); '/' stays unless `encode_slash` (object keys in a path keep it, query
// values encode it).
std::string UriEncode(std::string_view s, bool encode_slash);

// The canonical query string: names and values URI-encoded (slashes too), sorted by name then
// value, joined by '&'; a parameter without a value is "name=". The same string is what a
// request sends, so the signed and the sent query never differ.
std::string CanonicalQuery(std::vector<Param> params);

// "YYYYMMDDTHHMMSSZ" (UTC), the x-amz-date form.
std::string AmzDate(std::chrono::system_clock::time_point t);

struct SigningRequest {
  std::string method;           // "GET", "PUT", ...
  std::string canonical_uri;    // the URI-encoded path as sent, e.g. "/bucket/test%24file"
  std::string canonical_query;  // CanonicalQuery() of the parameters, as sent
  std::vector<Param> headers;   // every signed header; names any case; host and x-amz-date
                                // required, x-amz-content-sha256 for S3
  std::string payload_sha256;   // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
};

// The canonical request (step 1 of the specification): lower-cased, sorted header names;
// values trimmed with inner runs of spaces collapsed.
std::string CanonicalRequest(const SigningRequest& req);
// "host;range;x-amz-content-sha256;x-amz-date": the sorted, lower-cased header names.
std::string SignedHeaders(const SigningRequest& req);
// "AWS4-HMAC-SHA256\n<amz_date>\n<date>/<region>/<service>/aws4_request\n<hash of canonical>".
// REQUIRES: amz_date is AmzDate()'s form.
std::string StringToSign(std::string_view amz_date, std::string_view region,
                         std::string_view service, std::string_view canonical_request);
// The 64 hex digits of the signature.
std::string Signature(std::string_view secret_key, std::string_view amz_date,
                      std::string_view region, std::string_view service,
                      const SigningRequest& req);
// The value of the Authorization header:
// "AWS4-HMAC-SHA256 Credential=<key>/<scope>,SignedHeaders=<...>,Signature=<...>".
std::string Authorization(std::string_view access_key, std::string_view secret_key,
                          std::string_view region, std::string_view service,
                          std::string_view amz_date, const SigningRequest& req);

}  // namespace ckptfs::objstore
