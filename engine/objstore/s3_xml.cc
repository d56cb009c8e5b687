#include "engine/objstore/s3_xml.h"

#include <ctime>

namespace ckptfs::objstore {
namespace {

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out.push_back(s[i]);
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") out.push_back('&');
    else if (ent == "lt") out.push_back('<');
    else if (ent == "gt") out.push_back('>');
    else if (ent == "quot") out.push_back('"');
    else if (ent == "apos") out.push_back('\'');
    else if (ent.size() > 1 && ent[0] == '#') {
      bool hex = ent[1] == 'x' || ent[1] == 'X';
      uint32_t cp = 0;
      bool ok = ent.size() > (hex ? 2u : 1u);
      for (char c : ent.substr(hex ? 2 : 1)) {
        int d = (c >= '0' && c <= '9') ? c - '0'
                : (hex && c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (hex && c >= 'A' && c <= 'F') ? c - 'A' + 10
                                                 : -1;
        ok = ok && d >= 0 && cp < 0x110000;
        cp = cp * (hex ? 16 : 10) + static_cast<uint32_t>(d < 0 ? 0 : d);
      }
      if (!ok || cp >= 0x110000) {
        out.append(s.substr(i, semi - i + 1));
      } else {
        AppendUtf8(out, cp);
      }
    } else {
      out.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

}  // namespace

std::vector<std::string> XmlElements(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  // (appends, not "<" + ...: GCC 12 warns falsely about operator+ on a literal, -Wrestrict)
  std::string open(1, '<'), empty(1, '<'), close("</");
  open.append(tag).push_back('>');
  empty.append(tag).append("/>");
  close.append(tag).push_back('>');
  size_t pos = 0;
  while (true) {
    size_t a = xml.find(open, pos);
    size_t e = xml.find(empty, pos);
    if (e != std::string_view::npos && (a == std::string_view::npos || e < a)) {
      out.emplace_back();
      pos = e + empty.size();
      continue;
    }
    if (a == std::string_view::npos) break;
    size_t b = xml.find(close, a + open.size());
    if (b == std::string_view::npos) break;
    out.push_back(Unescape(xml.substr(a + open.size(), b - a - open.size())));
    pos = b + close.size();
  }
  return out;
}

std::optional<std::string> XmlElement(std::string_view xml, std::string_view tag) {
  std::vector<std::string> all = XmlElements(xml, tag);
  if (all.empty()) return std::nullopt;
  return std::move(all.front());
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

S3Error ParseS3Error(std::string_view xml) {
  S3Error e;
  e.code = XmlElement(xml, "Code").value_or("");
  e.message = XmlElement(xml, "Message").value_or("");
  return e;
}

std::optional<int64_t> ParseIso8601(std::string_view s) {
  std::tm tm{};
  std::string str(s.substr(0, 19));
  const char* end = strptime(str.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(timegm(&tm));
}

Result<ListPage> ParseListObjectsV2(std::string_view xml) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    return Status::Corruption("S3 list response is not a ListBucketResult");
  }
  ListPage page;
  // <Contents> holds Key, LastModified, ETag, Size, StorageClass (and Owner with its own
  // elements, none named like those).
  for (const std::string& c : XmlElements(xml, "Contents")) {
    ObjectEntry e;
    std::optional<std::string> key = XmlElement(c, "Key");
    std::optional<std::string> size = XmlElement(c, "Size");
    if (!key || !size) return Status::Corruption("S3 list entry without Key or Size");
    e.key = std::move(*key);
    char* end = nullptr;
    e.size = std::strtoull(size->c_str(), &end, 10);
    if (size->empty() || *end != '\0') return Status::Corruption("S3 list entry: bad Size");
    e.last_modified = ParseIso8601(XmlElement(c, "LastModified").value_or("")).value_or(0);
    e.etag = XmlElement(c, "ETag").value_or("");
    if (e.etag.size() >= 2 && e.etag.front() == '"' && e.etag.back() == '"') {
      e.etag = e.etag.substr(1, e.etag.size() - 2);
    }
    page.objects.push_back(std::move(e));
  }
  if (XmlElement(xml, "IsTruncated").value_or("false") == "true") {
    page.next_continuation_token = XmlElement(xml, "NextContinuationToken").value_or("");
    if (page.next_continuation_token.empty()) {
      return Status::Corruption("S3 list page truncated without a NextContinuationToken");
    }
  }
  return page;
}

Result<UploadsPage> ParseListMultipartUploads(std::string_view xml) {
  if (xml.find("<ListMultipartUploadsResult") == std::string_view::npos) {
    return Status::Corruption("S3 response is not a ListMultipartUploadsResult");
  }
  UploadsPage page;
  for (const std::string& u : XmlElements(xml, "Upload")) {
    std::optional<std::string> key = XmlElement(u, "Key");
    std::optional<std::string> id = XmlElement(u, "UploadId");
    if (!key || !id) return Status::Corruption("S3 upload entry without Key or UploadId");
    int64_t initiated = ParseIso8601(XmlElement(u, "Initiated").value_or("")).value_or(0);
    page.uploads.emplace_back(std::move(*key), std::move(*id), initiated);
  }
  if (XmlElement(xml, "IsTruncated").value_or("false") == "true") {
    page.next_key_marker = XmlElement(xml, "NextKeyMarker").value_or("");
    page.next_upload_id_marker = XmlElement(xml, "NextUploadIdMarker").value_or("");
    if (page.next_key_marker.empty()) {
      return Status::Corruption("S3 uploads page truncated without a NextKeyMarker");
    }
  }
  return page;
}

std::string CompleteMultipartBody(const std::vector<std::pair<int, std::string>>& parts) {
  std::string out = "<CompleteMultipartUpload>";
  for (const auto& [number, etag] : parts) {
    out += "<Part><PartNumber>" + std::to_string(number) + "</PartNumber><ETag>" +
           XmlEscape(etag) + "</ETag></Part>";
  }
  out += "</CompleteMultipartUpload>";
  return out;
}

}  // namespace ckptfs::objstore
