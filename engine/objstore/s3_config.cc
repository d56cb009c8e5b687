#include "engine/objstore/s3_config.h"

#include <cstdlib>
#include <fstream>
#include <map>

namespace ckptfs::objstore {
namespace {

using Section = std::map<std::string, std::string>;

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// The `name` section of an INI file ("[name]"), or an empty map when the file or section is
// missing. Comments (#, ;) and keys of nested blocks ("s3 =\n  key = v") are skipped.
Section ReadIniSection(const std::string& path, std::string_view name) {
  Section out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = Trim(std::string_view(t).substr(1, t.size() - 2)) == name;
      continue;
    }
    if (!inside || line[0] == ' ' || line[0] == '\t') continue;
    size_t eq = t.find('=');
    if (eq == std::string::npos) continue;
    out[Trim(std::string_view(t).substr(0, eq))] = Trim(std::string_view(t).substr(eq + 1));
  }
  return out;
}

std::string Get(const Environment& env, const char* name) {
  const char* v = env(name);
  return v ? std::string(v) : std::string();
}

std::string HomeFile(const Environment& env, const char* override_var, const char* rel) {
  std::string path = Get(env, override_var);
  if (!path.empty()) return path;
  std::string home = Get(env, "HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

}  // namespace

std::string S3Location::ToString() const {
  return prefix.empty() ? "s3://" + bucket : "s3://" + bucket + "/" + prefix;
}

std::string S3Location::Key(std::string_view name) const {
  return prefix.empty() ? std::string(name) : prefix + "/" + std::string(name);
}

Result<S3Location> ParseS3Location(std::string_view uri) {
  if (!IsS3Uri(uri)) {
    return Status::InvalidArgument("not an s3:// location: " + std::string(uri));
  }
  std::string_view rest = uri.substr(5);
  size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    loc.prefix = std::string(prefix);
  }
  // Bucket names: 3-63 of [a-z0-9.-], starting and ending with a letter or digit.
  bool valid = loc.bucket.size() >= 3 && loc.bucket.size() <= 63;
  for (char c : loc.bucket) {
    valid = valid && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-');
  }
  valid = valid && loc.bucket.front() != '-' && loc.bucket.front() != '.' &&
          loc.bucket.back() != '-' && loc.bucket.back() != '.';
  if (!valid) {
    return Status::InvalidArgument("bad bucket name '" + loc.bucket + "' in " +
                                   std::string(uri) +
                                   ": S3 wants 3-63 lower-case letters, digits, '.' or '-'");
  }
  if (loc.prefix.find("//") != std::string::npos || loc.prefix.starts_with("/")) {
    return Status::InvalidArgument("empty path segment in " + std::string(uri));
  }
  return loc;
}

Environment SystemEnvironment() {
  return [](const char* name) { return static_cast<const char*>(std::getenv(name)); };
}

Result<S3Config> ResolveS3Config(std::string_view endpoint, const Environment& env) {
  S3Config cfg;
  std::string profile = Get(env, "AWS_PROFILE");
  if (profile.empty()) profile = "default";
  Section creds = ReadIniSection(
      HomeFile(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), profile);
  Section config = ReadIniSection(HomeFile(env, "AWS_CONFIG_FILE", ".aws/config"),
                                  profile == "default" ? profile : "profile " + profile);

  cfg.credentials.access_key_id = Get(env, "AWS_ACCESS_KEY_ID");
  cfg.credentials.secret_access_key = Get(env, "AWS_SECRET_ACCESS_KEY");
  if (!cfg.credentials.access_key_id.empty() && !cfg.credentials.secret_access_key.empty()) {
    cfg.credentials.session_token = Get(env, "AWS_SESSION_TOKEN");
  } else {
    cfg.credentials.access_key_id = creds["aws_access_key_id"];
    cfg.credentials.secret_access_key = creds["aws_secret_access_key"];
    cfg.credentials.session_token = creds["aws_session_token"];
  }
  if (cfg.credentials.access_key_id.empty() || cfg.credentials.secret_access_key.empty()) {
    return Status::InvalidArgument(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put "
        "aws_access_key_id and aws_secret_access_key in the [" + profile +
        "] profile of ~/.aws/credentials");
  }

  cfg.endpoint = std::string(endpoint);
  for (const char* var : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    if (cfg.endpoint.empty()) cfg.endpoint = Get(env, var);
  }
  if (cfg.endpoint.empty()) cfg.endpoint = config["endpoint_url"];
  while (!cfg.endpoint.empty() && cfg.endpoint.back() == '/') cfg.endpoint.pop_back();
  if (cfg.endpoint.empty()) {
    return Status::InvalidArgument(
        "no S3 endpoint: pass --endpoint URL (e.g. http://rgw.example:7480) or set "
        "AWS_ENDPOINT_URL");
  }
  if (!cfg.endpoint.starts_with("http://") && !cfg.endpoint.starts_with("https://")) {
    return Status::InvalidArgument("S3 endpoint '" + cfg.endpoint +
                                   "' must start with http:// or https://");
  }
  if (cfg.endpoint.find('/', cfg.endpoint.find("//") + 2) != std::string::npos) {
    return Status::InvalidArgument("S3 endpoint '" + cfg.endpoint +
                                   "' must have no path (give the bucket in s3://BUCKET/...)");
  }

  for (std::string region : {Get(env, "AWS_REGION"), Get(env, "AWS_DEFAULT_REGION"),
                             config["region"]}) {
    if (!region.empty()) {
      cfg.region = region;
      break;
    }
  }
  return cfg;
}

}  // namespace ckptfs::objstore
