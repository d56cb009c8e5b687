#include "engine/objstore/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <ctime>

namespace ckptfs::objstore {
namespace {

using Digest = std::array<unsigned char, 32>;

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

Digest Hmac(const void* key, size_t key_len, std::string_view msg) {
  Digest out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key, static_cast<int>(key_len),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Trims and collapses runs of spaces, as the canonical headers require.
std::string TrimCollapse(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::vector<Param> CanonicalHeaders(const SigningRequest& req) {
  std::vector<Param> headers;
  headers.reserve(req.headers.size());
  for (const auto& [name, value] : req.headers) {
    headers.emplace_back(Lower(name), TrimCollapse(value));
  }
  std::sort(headers.begin(), headers.end());
  return headers;
}

}  // namespace

std::string Sha256Hex(Bytes data) {
  Digest d{};
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d.data());
  return Hex(d.data(), d.size());
}

std::string UriEncode(std::string_view s, bool encode_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '.' || c == '_' || c == '~' || (c == '/' && !encode_slash);
    if (keep) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

std::string CanonicalQuery(std::vector<Param> params) {
  for (auto& [name, value] : params) {
    name = UriEncode(name, true);
    value = UriEncode(value, true);
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out.push_back('&');
    out += name;
    out.push_back('=');
    out += value;
  }
  return out;
}

std::string AmzDate(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[20];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string SignedHeaders(const SigningRequest& req) {
  std::string out;
  for (const auto& [name, value] : CanonicalHeaders(req)) {
    if (!out.empty()) out.push_back(';');
    out += name;
  }
  return out;
}

std::string CanonicalRequest(const SigningRequest& req) {
  std::string out = req.method + "\n" + req.canonical_uri + "\n" + req.canonical_query + "\n";
  for (const auto& [name, value] : CanonicalHeaders(req)) {
    out.append(name).append(":").append(value).append("\n");
  }
  out.append("\n").append(SignedHeaders(req)).append("\n").append(req.payload_sha256);
  return out;
}

namespace {

// "<date>/<region>/<service>/aws4_request": the credential scope of the string to sign and of
// the Authorization header.
std::string CredentialScope(std::string_view amz_date, std::string_view region,
                            std::string_view service) {
  std::string out(amz_date.substr(0, 8));
  out += "/";
  out += region;
  out += "/";
  out += service;
  out += "/aws4_request";
  return out;
}

}  // namespace

std::string StringToSign(std::string_view amz_date, std::string_view region,
                         std::string_view service, std::string_view canonical_request) {
  std::string out = "AWS4-HMAC-SHA256\n";
  out += amz_date;
  out += "\n";
  out += CredentialScope(amz_date, region, service);
  out += "\n";
  out += Sha256Hex(AsBytes(canonical_request));
  return out;
}

std::string Signature(std::string_view secret_key, std::string_view amz_date,
                      std::string_view region, std::string_view service,
                      const SigningRequest& req) {
  std::string k_secret = "AWS4";
  k_secret += secret_key;
  Digest k_date = Hmac(k_secret.data(), k_secret.size(), amz_date.substr(0, 8));
  Digest k_region = Hmac(k_date.data(), k_date.size(), region);
  Digest k_service = Hmac(k_region.data(), k_region.size(), service);
  Digest k_signing = Hmac(k_service.data(), k_service.size(), "aws4_request");
  std::fill(k_secret.begin(), k_secret.end(), '\0');
  Digest sig = Hmac(k_signing.data(), k_signing.size(),
                    StringToSign(amz_date, region, service, CanonicalRequest(req)));
  return Hex(sig.data(), sig.size());
}

std::string Authorization(std::string_view access_key, std::string_view secret_key,
                          std::string_view region, std::string_view service,
                          std::string_view amz_date, const SigningRequest& req) {
  std::string out = "AWS4-HMAC-SHA256 Credential=";
  out += access_key;
  out += "/";
  out += CredentialScope(amz_date, region, service);
  out += ",SignedHeaders=" + SignedHeaders(req) +
         ",Signature=" + Signature(secret_key, amz_date, region, service, req);
  return out;
}

}  // namespace ckptfs::objstore
