#include "engine/objstore/s3_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "engine/objstore/sigv4.h"

namespace ckptfs::objstore {
namespace {

constexpr std::string_view kChecksumHeader = "x-amz-meta-ckptfs-sha256";
constexpr size_t kFileReadBlock = size_t{1} << 20;
// libcurl's receive and send buffers (defaults 16 KiB and 64 KiB): fewer, larger copies.
constexpr long kCurlBufferBytes = 512L << 10;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string HostOf(std::string_view endpoint) {
  size_t start = endpoint.find("//");
  return std::string(start == std::string_view::npos ? endpoint : endpoint.substr(start + 2));
}

// "Fri, 04 Dec 2026 15:26:00 GMT" -> seconds since the epoch (0 when malformed).
int64_t ParseHttpDate(const std::string& s) {
  std::tm tm{};
  const char* end = strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S", &tm);
  return end == nullptr ? 0 : static_cast<int64_t>(timegm(&tm));
}

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

bool RetriableCurl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

bool RetriableHttp(long status, std::string_view s3_code) {
  return status >= 500 || status == 429 || status == 408 || s3_code == "SlowDown" ||
         s3_code == "RequestTimeout" || s3_code == "InternalError";
}

class Sha256Stream {
 public:
  Sha256Stream() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256Stream() { EVP_MD_CTX_free(ctx_); }
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(Bytes b) { EVP_DigestUpdate(ctx_, b.data(), b.size()); }
  std::string HexDigest() {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, d, &n);
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(2 * n, '0');
    for (unsigned int i = 0; i < n; ++i) {
      out[2 * i] = kDigits[d[i] >> 4];
      out[2 * i + 1] = kDigits[d[i] & 15];
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

// ------------------------------------------------------------------ requests and responses

struct S3Client::Request {
  std::string method;  // GET PUT POST DELETE HEAD
  std::string bucket;
  std::string key;  // empty for bucket-level requests
  std::vector<Param> query;
  std::vector<Param> headers;  // extra headers, all signed
  Bytes body;
  std::string body_sha256 = std::string(kEmptySha256);

  std::string What() const {
    return method + " s3://" + bucket + (key.empty() ? "" : "/" + key);
  }
};

struct S3Client::Response {
  long status = 0;
  std::vector<Param> headers;  // lower-case names
  Buffer body;

  std::string Header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
      if (n == name) return v;
    }
    return "";
  }
  std::string_view Text() const { return AsChars(body.bytes()); }
};

// One curl easy handle (it keeps its connection open between requests).
class S3Client::Connection {
 public:
  Connection() : curl_(curl_easy_init()) {}
  ~Connection() {
    if (curl_ != nullptr) curl_easy_cleanup(curl_);
  }
  CURL* get() { return curl_; }

 private:
  CURL* curl_;
};

// Where upload bytes come from: memory or a file.
class S3Client::PartSource {
 public:
  virtual ~PartSource() = default;
  // Bytes [offset, offset + length), valid until the next call.
  virtual Result<Bytes> Read(uint64_t offset, size_t length) = 0;
};

namespace {

class MemorySource final : public S3Client::PartSource {
 public:
  explicit MemorySource(Bytes data) : data_(data) {}
  Result<Bytes> Read(uint64_t offset, size_t length) override {
    return data_.subspan(offset, length);
  }

 private:
  Bytes data_;
};

class FileSource final : public S3Client::PartSource {
 public:
  FileSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~FileSource() override { ::close(fd_); }
  Result<Bytes> Read(uint64_t offset, size_t length) override {
    buf_.Resize(length);
    size_t done = 0;
    while (done < length) {
      ssize_t n = ::pread(fd_, buf_.data() + done, length - done,
                          static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::FromErrno(errno, "read " + path_);
      if (n == 0) return Status::IOError(path_ + " shrank while it was being uploaded");
      done += static_cast<size_t>(n);
    }
    return buf_.bytes();
  }

 private:
  int fd_;
  std::string path_;
  Buffer buf_;
};

struct UploadCursor {
  Bytes data;
  size_t pos = 0;
};

size_t ReadBody(char* out, size_t size, size_t n, void* arg) {
  auto* c = static_cast<UploadCursor*>(arg);
  size_t len = std::min(size * n, c->data.size() - c->pos);
  if (len > 0) std::memcpy(out, c->data.data() + c->pos, len);
  c->pos += len;
  return len;
}

int SeekBody(void* arg, curl_off_t offset, int origin) {
  auto* c = static_cast<UploadCursor*>(arg);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > c->data.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  c->pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

struct ResponseSink {
  long status = 0;
  std::vector<Param>* headers;
  Buffer* body;
};

size_t WriteBody(char* data, size_t size, size_t n, void* arg) {
  auto* sink = static_cast<ResponseSink*>(arg);
  sink->body->Append({reinterpret_cast<const std::byte*>(data), size * n});
  return size * n;
}

size_t WriteHeader(char* data, size_t size, size_t n, void* arg) {
  auto* sink = static_cast<ResponseSink*>(arg);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) {  // a new response (after 100 Continue): start over
    sink->headers->clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string value(line.substr(colon + 1));
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
    value.pop_back();
  }
  size_t first = value.find_first_not_of(' ');
  value = first == std::string::npos ? "" : value.substr(first);
  std::string name = Lower(line.substr(0, colon));
  if (name == "content-length") {
    uint64_t len = std::strtoull(value.c_str(), nullptr, 10);
    if (len > 0 && len < (uint64_t{1} << 34)) sink->body->Reserve(static_cast<size_t>(len));
  }
  sink->headers->emplace_back(std::move(name), std::move(value));
  return size * n;
}

}  // namespace

// ------------------------------------------------------------------ set-up

Result<std::unique_ptr<S3Client>> S3Client::Open(S3Config config) {
  static std::once_flag once;
  static CURLcode init_rc = CURLE_OK;
  std::call_once(once, [] { init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init_rc != CURLE_OK) {
    return Status::IOError(std::string("libcurl failed to initialise: ") +
                           curl_easy_strerror(init_rc));
  }
  if (config.endpoint.empty()) return Status::InvalidArgument("S3 client without an endpoint");
  if (config.part_bytes < (uint64_t{5} << 20)) {
    return Status::InvalidArgument("S3 multipart parts must be at least 5 MiB");
  }
  if (config.retry.max_attempts < 1) config.retry.max_attempts = 1;
  return std::unique_ptr<S3Client>(new S3Client(std::move(config)));
}

S3Client::S3Client(S3Config config)
    : config_(std::move(config)), host_(HostOf(config_.endpoint)) {}

S3Client::~S3Client() = default;

std::unique_ptr<S3Client::Connection> S3Client::Borrow() {
  {
    MutexLock lock(pool_mu_);
    if (!pool_.empty()) {
      std::unique_ptr<Connection> c = std::move(pool_.back());
      pool_.pop_back();
      return c;
    }
  }
  return std::make_unique<Connection>();
}

void S3Client::Return(std::unique_ptr<Connection> conn) {
  MutexLock lock(pool_mu_);
  pool_.push_back(std::move(conn));
}

S3Stats S3Client::stats() const {
  return {requests_.load(), retries_.load(), bytes_sent_.load(), bytes_received_.load()};
}

// ------------------------------------------------------------------ sending

Result<S3Client::Response> S3Client::SendOnce(Connection& conn, const Request& req) {
  CURL* curl = conn.get();
  if (curl == nullptr) return Status::IOError("libcurl could not create a handle");
  curl_easy_reset(curl);

  // (appends, not "/" + ...: GCC 12 warns falsely about operator+ on a literal, -Wrestrict)
  std::string uri = "/";
  uri += UriEncode(req.bucket, true);
  if (!req.key.empty()) {
    uri.push_back('/');
    uri += UriEncode(req.key, false);
  }
  std::string query = CanonicalQuery(req.query);
  std::string url = config_.endpoint + uri;
  if (!query.empty()) {
    url.push_back('?');
    url += query;
  }

  std::string amz_date = AmzDate(std::chrono::system_clock::now());
  SigningRequest sreq{req.method, uri, query, req.headers, req.body_sha256};
  sreq.headers.emplace_back("host", host_);
  sreq.headers.emplace_back("x-amz-date", amz_date);
  sreq.headers.emplace_back("x-amz-content-sha256", req.body_sha256);
  if (!config_.credentials.session_token.empty()) {
    sreq.headers.emplace_back("x-amz-security-token", config_.credentials.session_token);
  }
  std::string auth =
      Authorization(config_.credentials.access_key_id, config_.credentials.secret_access_key,
                    config_.region, "s3", amz_date, sreq);

  curl_slist* headers = nullptr;
  for (const auto& [name, value] : sreq.headers) {
    headers = curl_slist_append(headers, (name + ": " + value).c_str());
  }
  headers = curl_slist_append(headers, ("Authorization: " + auth).c_str());
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  if (req.method == "PUT" || req.method == "POST") {
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
  }
  std::fill(auth.begin(), auth.end(), '\0');

  Response resp;
  ResponseSink sink{0, &resp.headers, &resp.body};
  UploadCursor cursor{req.body, 0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(config_.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(config_.stall_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, kCurlBufferBytes);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, kCurlBufferBytes);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, WriteHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &sink);
  if (req.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &cursor);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, SeekBody);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &cursor);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (req.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS,
                     req.body.empty() ? "" : reinterpret_cast<const char*>(req.body.data()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (req.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (req.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }

  requests_.fetch_add(1, std::memory_order_relaxed);
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  if (rc != CURLE_OK) {
    Status st = Status::IOError(req.What() + ": " + curl_easy_strerror(rc) + " (" +
                                config_.endpoint + ")");
    return RetriableCurl(rc) ? Status::Busy(st.message()) : st;
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
  bytes_sent_.fetch_add(req.body.size(), std::memory_order_relaxed);
  bytes_received_.fetch_add(resp.body.size(), std::memory_order_relaxed);
  return resp;
}

// Transient failures come back from SendOnce as Busy (connection, stall) or as a retriable
// HTTP status; both are retried here.
Result<S3Client::Response> S3Client::Execute(const Request& req) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::string last;
  for (int attempt = 1;; ++attempt) {
    std::unique_ptr<Connection> conn = Borrow();
    Result<Response> resp = SendOnce(*conn, req);
    if (resp.ok() || resp.status().code() != Status::Code::kBusy) Return(std::move(conn));
    if (resp.ok()) {
      std::string code =
          resp->status >= 400 ? ParseS3Error(resp->Text()).code : std::string();
      if (!RetriableHttp(resp->status, code)) return resp;
      last = req.What() + ": HTTP " + std::to_string(resp->status) + " " + code;
    } else if (resp.status().code() == Status::Code::kBusy) {
      last = resp.status().message();
    } else {
      return resp.status();
    }
    if (attempt >= config_.retry.max_attempts) break;
    auto cap = std::min(config_.retry.max_backoff,
                        config_.retry.first_backoff * (int64_t{1} << std::min(attempt - 1, 20)));
    auto delay = std::chrono::milliseconds(
        std::uniform_int_distribution<int64_t>(cap.count() / 2, cap.count())(rng));
    spdlog::warn("{}; retry {} of {} in {} ms", last, attempt, config_.retry.max_attempts - 1,
                 delay.count());
    retries_.fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(delay);
  }
  return Status::IOError(last + " (gave up after " + std::to_string(config_.retry.max_attempts) +
                         " attempts; is the S3 endpoint up?)");
}

namespace {

// The Status for a final non-2xx response.
Status HttpError(const std::string& what, long status, std::string_view body) {
  S3Error e = ParseS3Error(body);
  std::string detail = what + ": HTTP " + std::to_string(status) +
                       (e.code.empty() ? "" : " " + e.code) +
                       (e.message.empty() ? "" : " (" + e.message + ")");
  if (status == 404) return Status::NotFound(detail);
  if (status == 403 || e.code == "AccessDenied" || e.code == "SignatureDoesNotMatch" ||
      e.code == "InvalidAccessKeyId") {
    return Status::FromErrno(EACCES, detail + ": check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                                              "(or the profile) and the bucket's owner");
  }
  if (status == 507 || e.code == "QuotaExceeded" || e.code == "EntityTooLarge") {
    return Status::NoSpace(detail);
  }
  return Status::IOError(detail);
}

}  // namespace

// ------------------------------------------------------------------ operations

Status S3Client::CreateBucket(std::string_view bucket) {
  Request req{"PUT", std::string(bucket), "", {}, {}, {}};
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 == 2) return Status::OK();
  if (ParseS3Error(resp.Text()).code == "BucketAlreadyOwnedByYou") return Status::OK();
  return HttpError(req.What(), resp.status, resp.Text());
}

Status S3Client::Put(std::string_view bucket, std::string_view key, Bytes data,
                     std::string_view sha256) {
  MemorySource source(data);
  return Upload(bucket, key, data.size(), sha256.empty() ? Sha256Hex(data) : std::string(sha256),
                source);
}

Status S3Client::PutFile(std::string_view bucket, std::string_view key,
                         const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  FileSource source(fd, path.string());
  struct stat st{};
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + path.string());
  uint64_t size = static_cast<uint64_t>(st.st_size);
  Sha256Stream sha;
  for (uint64_t off = 0; off < size; off += kFileReadBlock) {
    CKPTFS_ASSIGN_OR_RETURN(Bytes block,
                            source.Read(off, static_cast<size_t>(std::min<uint64_t>(
                                                 kFileReadBlock, size - off))));
    sha.Update(block);
  }
  return Upload(bucket, key, size, sha.HexDigest(), source);
}

Status S3Client::Upload(std::string_view bucket, std::string_view key, uint64_t size,
                        const std::string& sha256, PartSource& source) {
  if (size > config_.multipart_threshold) {
    return UploadMultipart(bucket, key, size, sha256, source);
  }
  CKPTFS_ASSIGN_OR_RETURN(Bytes body, source.Read(0, static_cast<size_t>(size)));
  Request req{"PUT", std::string(bucket), std::string(key), {},
              {{std::string(kChecksumHeader), sha256}}, body};
  // The body is the whole object: its hash is `sha256`, which the signature then vouches for
  // (the gateway checks the payload against it), so the stored checksum cannot disagree with
  // the bytes stored. Hashing the body again cost a second SHA-256 of every upload.
  req.body_sha256 = sha256;
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 != 2) return HttpError(req.What(), resp.status, resp.Text());
  return Status::OK();
}

Status S3Client::UploadMultipart(std::string_view bucket, std::string_view key, uint64_t size,
                                 const std::string& sha256, PartSource& source) {
  Request create{"POST", std::string(bucket), std::string(key), {{"uploads", ""}},
                 {{std::string(kChecksumHeader), sha256}}, {}};
  CKPTFS_ASSIGN_OR_RETURN(Response created, Execute(create));
  if (created.status / 100 != 2) return HttpError(create.What(), created.status, created.Text());
  std::optional<std::string> upload_id = XmlElement(created.Text(), "UploadId");
  if (!upload_id || upload_id->empty()) {
    return Status::Corruption(create.What() + ": no UploadId in the response");
  }

  auto upload_parts = [&]() -> Status {
    std::vector<std::pair<int, std::string>> parts;
    int number = 1;
    for (uint64_t off = 0; off < size; off += config_.part_bytes, ++number) {
      size_t len = static_cast<size_t>(std::min(config_.part_bytes, size - off));
      CKPTFS_ASSIGN_OR_RETURN(Bytes body, source.Read(off, len));
      Request part{"PUT", std::string(bucket), std::string(key),
                   {{"partNumber", std::to_string(number)}, {"uploadId", *upload_id}}, {}, body};
      part.body_sha256 = Sha256Hex(body);
      CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(part));
      if (resp.status / 100 != 2) {
        return HttpError(part.What() + " part " + std::to_string(number), resp.status,
                         resp.Text());
      }
      std::string etag = resp.Header("etag");
      if (etag.empty()) return Status::Corruption(part.What() + ": part without an ETag");
      parts.emplace_back(number, std::move(etag));
    }
    std::string xml = CompleteMultipartBody(parts);
    Request complete{"POST", std::string(bucket), std::string(key),
                     {{"uploadId", *upload_id}}, {}, AsBytes(xml)};
    complete.body_sha256 = Sha256Hex(AsBytes(xml));
    CKPTFS_ASSIGN_OR_RETURN(Response done, Execute(complete));
    // CompleteMultipartUpload may fail with HTTP 200 and an <Error> body.
    if (done.status / 100 != 2 || done.Text().find("<Error>") != std::string_view::npos) {
      return HttpError(complete.What(), done.status == 200 ? 500 : done.status, done.Text());
    }
    return Status::OK();
  };
  Status st = upload_parts();
  if (!st.ok()) {
    Status aborted = AbortUpload(bucket, key, *upload_id);
    if (!aborted.ok()) {
      spdlog::warn("could not abort the failed upload of s3://{}/{}: {} (gc collects it)",
                   bucket, key, aborted.ToString());
    }
  }
  return st;
}

Result<Buffer> S3Client::GetVerified(std::string_view bucket, std::string_view key,
                                     std::string_view expected_sha256) {
  Request req{"GET", std::string(bucket), std::string(key), {}, {}, {}};
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 != 2) return HttpError(req.What(), resp.status, resp.Text());
  std::string length = resp.Header("content-length");
  if (!length.empty() && std::strtoull(length.c_str(), nullptr, 10) != resp.body.size()) {
    return Status::Corruption(req.What() + ": got " + std::to_string(resp.body.size()) +
                              " bytes of " + length);
  }
  std::string want = resp.Header(std::string(kChecksumHeader));
  if (!expected_sha256.empty()) {
    if (!want.empty() && want != expected_sha256) {
      return Status::Corruption(req.What() + ": its stored SHA-256 is not the expected one");
    }
    want = std::string(expected_sha256);
  }
  if (!want.empty() && Sha256Hex(resp.body.bytes()) != want) {
    return Status::Corruption(req.What() + ": the downloaded bytes do not match the SHA-256 "
                                           "stored with the object");
  }
  return std::move(resp.body);
}

Result<Buffer> S3Client::Get(std::string_view bucket, std::string_view key) {
  return Get(bucket, key, "");
}

Result<Buffer> S3Client::Get(std::string_view bucket, std::string_view key,
                             std::string_view sha256) {
  Result<Buffer> first = GetVerified(bucket, key, sha256);
  if (first.ok() || !first.status().IsCorruption()) return first;
  spdlog::warn("{}; downloading it again", first.status().message());
  return GetVerified(bucket, key, sha256);
}

Result<Buffer> S3Client::GetRange(std::string_view bucket, std::string_view key,
                                  uint64_t offset, uint64_t length) {
  if (length == 0) return Buffer();
  Request req{"GET", std::string(bucket), std::string(key), {},
              {{"range", "bytes=" + std::to_string(offset) + "-" +
                             std::to_string(offset + length - 1)}},
              {}};
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status == 416) return Buffer();  // the range starts at or past the end
  if (resp.status / 100 != 2) return HttpError(req.What(), resp.status, resp.Text());
  if (resp.status == 200) {  // a server that ignores Range sends the whole object
    if (offset >= resp.body.size()) return Buffer();
    size_t n = static_cast<size_t>(std::min<uint64_t>(length, resp.body.size() - offset));
    return Buffer(resp.body.bytes().subspan(static_cast<size_t>(offset), n));
  }
  if (resp.body.size() > length) {
    return Status::Corruption(req.What() + ": a range of " + std::to_string(length) +
                              " bytes came back as " + std::to_string(resp.body.size()));
  }
  std::string total = resp.Header("content-range");  // "bytes a-b/size"
  size_t slash = total.rfind('/');
  if (slash != std::string::npos && resp.body.size() < length) {
    uint64_t size = std::strtoull(total.c_str() + slash + 1, nullptr, 10);
    if (offset + resp.body.size() != size) {
      return Status::Corruption(req.What() + ": short range read (" +
                                std::to_string(resp.body.size()) + " of " +
                                std::to_string(length) + " bytes)");
    }
  }
  return std::move(resp.body);
}

Result<ObjectInfo> S3Client::Head(std::string_view bucket, std::string_view key) {
  Request req{"HEAD", std::string(bucket), std::string(key), {}, {}, {}};
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 != 2) return HttpError(req.What(), resp.status, "");
  ObjectInfo info;
  info.size = std::strtoull(resp.Header("content-length").c_str(), nullptr, 10);
  info.etag = Unquote(resp.Header("etag"));
  info.sha256 = resp.Header(std::string(kChecksumHeader));
  info.last_modified = ParseHttpDate(resp.Header("last-modified"));
  return info;
}

Status S3Client::Delete(std::string_view bucket, std::string_view key) {
  Request req{"DELETE", std::string(bucket), std::string(key), {}, {}, {}};
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 == 2 || resp.status == 404) return Status::OK();
  return HttpError(req.What(), resp.status, resp.Text());
}

Result<ListPage> S3Client::ListOnePage(std::string_view bucket, std::string_view prefix,
                                       std::string_view continuation_token, int max_keys) {
  Request req{"GET", std::string(bucket), "",
              {{"list-type", "2"}, {"prefix", std::string(prefix)},
               {"max-keys", std::to_string(max_keys)}},
              {}, {}};
  if (!continuation_token.empty()) {
    req.query.emplace_back("continuation-token", std::string(continuation_token));
  }
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 != 2) return HttpError(req.What(), resp.status, resp.Text());
  return ParseListObjectsV2(resp.Text());
}

Result<std::vector<ObjectEntry>> S3Client::List(std::string_view bucket,
                                                 std::string_view prefix) {
  std::vector<ObjectEntry> all;
  std::string token;
  do {
    CKPTFS_ASSIGN_OR_RETURN(ListPage page, ListOnePage(bucket, prefix, token));
    for (ObjectEntry& e : page.objects) all.push_back(std::move(e));
    token = std::move(page.next_continuation_token);
  } while (!token.empty());
  return all;
}

Result<std::vector<UploadEntry>> S3Client::ListUploads(std::string_view bucket,
                                                       std::string_view prefix) {
  std::vector<UploadEntry> all;
  std::string key_marker, id_marker;
  do {
    Request req{"GET", std::string(bucket), "", {{"uploads", ""}, {"prefix", std::string(prefix)}},
                {}, {}};
    if (!key_marker.empty()) {
      req.query.emplace_back("key-marker", key_marker);
      req.query.emplace_back("upload-id-marker", id_marker);
    }
    CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
    if (resp.status / 100 != 2) return HttpError(req.What(), resp.status, resp.Text());
    CKPTFS_ASSIGN_OR_RETURN(UploadsPage page, ParseListMultipartUploads(resp.Text()));
    for (auto& [key, id, initiated] : page.uploads) {
      all.push_back({std::move(key), std::move(id), initiated});
    }
    key_marker = std::move(page.next_key_marker);
    id_marker = std::move(page.next_upload_id_marker);
  } while (!key_marker.empty());
  return all;
}

Status S3Client::AbortUpload(std::string_view bucket, std::string_view key,
                             std::string_view upload_id) {
  Request req{"DELETE", std::string(bucket), std::string(key),
              {{"uploadId", std::string(upload_id)}}, {}, {}};
  CKPTFS_ASSIGN_OR_RETURN(Response resp, Execute(req));
  if (resp.status / 100 == 2 || resp.status == 404) return Status::OK();
  return HttpError(req.What() + " (abort upload)", resp.status, resp.Text());
}

Result<S3Store> OpenS3Store(std::string_view uri, std::string_view endpoint) {
  S3Store store;
  CKPTFS_ASSIGN_OR_RETURN(store.location, ParseS3Location(uri));
  CKPTFS_ASSIGN_OR_RETURN(S3Config cfg, ResolveS3Config(endpoint, SystemEnvironment()));
  store.endpoint = cfg.endpoint;
  CKPTFS_ASSIGN_OR_RETURN(store.client, S3Client::Open(std::move(cfg)));
  return store;
}

}  // namespace ckptfs::objstore
