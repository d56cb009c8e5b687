// engine/objstore/s3_xml.h
//
// The few XML shapes S3 speaks, read and written in one place: error bodies, ListObjectsV2
// pages, InitiateMultipartUploadResult, and the CompleteMultipartUpload request. Not a general
// XML parser: S3 responses are flat, known documents (no attributes we need, no CDATA).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/util/status.h"

namespace ckptfs::objstore {

// The text of every <tag>...</tag> element in `xml`, in order, entities decoded
// (&amp; &lt; &gt; &quot; &apos; &#N; &#xN;). Nested elements of the same tag are not supported.
std::vector<std::string> XmlElements(std::string_view xml, std::string_view tag);
// The first such element, if any.
std::optional<std::string> XmlElement(std::string_view xml, std::string_view tag);
// `s` with & < > " ' escaped.
std::string XmlEscape(std::string_view s);

struct S3Error {
  std::string code;     // "NoSuchKey", "SlowDown", ...
  std::string message;  // the server's words
};
// The <Error> body of a failed request (fields empty when the body is not one).
S3Error ParseS3Error(std::string_view xml);

struct ObjectEntry {
  std::string key;
  uint64_t size = 0;
  int64_t last_modified = 0;  // seconds since the epoch (UTC)
  std::string etag;           // without quotes
};
struct ListPage {
  std::vector<ObjectEntry> objects;
  std::string next_continuation_token;  // empty when this is the last page
};
Result<ListPage> ParseListObjectsV2(std::string_view xml);

struct UploadsPage {
  std::vector<std::tuple<std::string, std::string, int64_t>> uploads;  // key, id, initiated
  std::string next_key_marker;        // both empty when this is the last page
  std::string next_upload_id_marker;
};
Result<UploadsPage> ParseListMultipartUploads(std::string_view xml);

// "2009-10-12T17:50:30.000Z" -> seconds since the epoch; nullopt when malformed.
std::optional<int64_t> ParseIso8601(std::string_view s);

// <CompleteMultipartUpload> with (part number, ETag as returned) pairs.
std::string CompleteMultipartBody(const std::vector<std::pair<int, std::string>>& parts);

}  // namespace ckptfs::objstore
