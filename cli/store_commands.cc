// put, get, rm, ls, init, upgrade: the commands that work on a store directory (cli/cli.h).
#include "cli/store_commands.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "engine/objstore/bucket_mirror.h"
#include "engine/objstore/s3_client.h"
#include "engine/store/content_writer.h"

namespace ckptfs::cli {
namespace {

constexpr size_t kIoBytes = 4 << 20;

}  // namespace

Result<std::unique_ptr<Store>> OpenStore(const std::string& dir, StoreOptions options) {
  auto store = Store::Open(dir, options);
  if (store.ok()) return store;
  const Status& s = store.status();
  if (s.IsNotFound()) {
    return Status::NotFound(s.message() + ": create one with `ckptfs init " + dir +
                            "` (or pass --create)");
  }
  if (s.code() == Status::Code::kBusy) {
    if (auto m = MountOfStore(dir)) {
      return Status::Busy("the store at " + dir + " is mounted at " + m->mountpoint +
                          "; this command needs it unmounted: `ckptfs umount " + m->mountpoint +
                          "` first");
    }
  }
  return s;
}

Result<std::unique_ptr<Store>> OpenExistingStore(const std::string& dir) {
  StoreOptions options;
  options.create_if_missing = false;
  return OpenStore(dir, options);
}

int Put(const std::string& dir, const std::string& name, const std::string& codec, bool create) {
  StoreOptions options;
  options.create_if_missing = create;
  if (!codec.empty()) {
    auto spec = CodecSpec::Parse(codec);
    if (!spec.ok()) return Fail(spec.status());
    options.codec = *spec;
  }
  auto store = OpenStore(dir, options);
  if (!store.ok()) return Fail(store.status());
  auto writer = (*store)->NewWriter();
  Buffer buf(kIoBytes);
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(Status::FromErrno(errno, "read standard input"));
    if (n == 0) break;
    Status s = writer->Append(buf.bytes().first(static_cast<size_t>(n)));
    if (!s.ok()) return Fail(s);
  }
  Store* st = store->get();
  auto id = writer->Finish([&](Catalog::WriteTxn& txn, ContentId content) {
    return st->BindNameInTxn(txn, name, content);
  });
  if (!id.ok()) return Fail(id.status());
  return kExitOk;
}

int Get(const std::string& dir, const std::string& name) {
  auto store = OpenExistingStore(dir);
  if (!store.ok()) return Fail(store.status());
  auto id = (*store)->LookupName(name);
  if (!id.ok()) return Fail(id.status());
  Buffer buf(kIoBytes);
  for (uint64_t offset = 0;;) {
    auto n = (*store)->Read(*id, offset, buf.mutable_bytes());
    if (!n.ok()) return Fail(n.status());
    if (*n == 0) break;
    size_t done = 0;
    while (done < *n) {
      ssize_t w = ::write(STDOUT_FILENO, buf.data() + done, *n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Fail(Status::FromErrno(errno, "write standard output"));
      done += static_cast<size_t>(w);
    }
    offset += *n;
  }
  return kExitOk;
}

int Remove(const std::string& dir, const std::string& name) {
  auto store = OpenExistingStore(dir);
  if (!store.ok()) return Fail(store.status());
  Status s = (*store)->RemoveName(name);
  return s.ok() ? kExitOk : Fail(s);
}

int List(const std::string& dir, bool json) {
  auto store = OpenExistingStore(dir);
  if (!store.ok()) return Fail(store.status());
  auto txn = (*store)->catalog().BeginRead();
  if (!txn.ok()) return Fail(txn.status());
  nlohmann::json names = nlohmann::json::array();
  Status s = txn->ForEachName([&](std::string_view name, ContentId id) {
    auto row = txn->GetContent(id);
    uint64_t size = row.ok() && *row ? (*row)->size : 0;
    if (json) {
      names.push_back({{"name", name}, {"size", size}});
    } else {
      std::printf("%14llu  %.*s\n", static_cast<unsigned long long>(size),
                  static_cast<int>(name.size()), name.data());
    }
    return true;
  });
  if (!s.ok()) return Fail(s);
  if (json) PrintJson({{"names", names}});
  return kExitOk;
}

int Init(const std::string& dir, const std::string& codec, bool json) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / "ckptfs.json", ec)) {
    return Fail(Status::AlreadyExists("there is a ckptfs store at " + dir + " already"));
  }
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_empty(dir, ec)) {
    return Fail(Status::AlreadyExists(dir + " exists and is not empty"),
                "a store needs a directory of its own: give a new or empty one");
  }
  StoreOptions options;
  if (!codec.empty()) {
    auto spec = CodecSpec::Parse(codec);
    if (!spec.ok()) return Fail(spec.status());
    options.codec = *spec;
  }
  auto store = Store::Open(dir, options);
  if (!store.ok()) return Fail(store.status());
  const std::string recorded = (*store)->options().codec->ToString();
  if (json) {
    PrintJson({{"store", RealPath(dir)}, {"format", kStoreFormatVersion}, {"codec", recorded}});
  } else {
    std::printf("created a ckptfs store at %s (format %u, codec %s)\n", RealPath(dir).c_str(),
                kStoreFormatVersion, recorded.c_str());
  }
  return kExitOk;
}

int InitS3(const std::string& location, const std::string& endpoint, const std::string& codec,
           bool json) {
  auto s3 = objstore::OpenS3Store(location, endpoint);
  if (!s3.ok()) return Fail(s3.status());
  // The parameters come from a store made for the purpose (as `ckptfs init DIR` makes one).
  char tmpl[] = "/tmp/ckptfs-init-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Fail(Status::FromErrno(errno, "mkdtemp /tmp"));
  std::string recorded;
  Status st;
  {
    StoreOptions options;
    if (!codec.empty()) {
      auto spec = CodecSpec::Parse(codec);
      if (!spec.ok()) return Fail(spec.status());
      options.codec = *spec;
    }
    options.space_reserve_bytes = 0;
    options.reverse_deltas = false;
    auto store = Store::Open(std::filesystem::path(tmpl) / "store", options);
    st = store.status();
    if (st.ok()) {
      recorded = (*store)->options().codec->ToString();
      st = objstore::BucketMirror::InitBucket(*s3->client, s3->location, (*store)->dir());
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  if (!st.ok()) return Fail(st);
  if (json) {
    PrintJson({{"store", s3->location.ToString()}, {"endpoint", s3->endpoint},
               {"format", kStoreFormatVersion}, {"codec", recorded}});
  } else {
    std::printf("created a ckptfs store at %s on %s (format %u, codec %s)\n",
                s3->location.ToString().c_str(), s3->endpoint.c_str(), kStoreFormatVersion,
                recorded.c_str());
  }
  return kExitOk;
}

int GcS3(const std::string& location, const std::string& endpoint, double grace_seconds,
         bool json) {
  auto s3 = objstore::OpenS3Store(location, endpoint);
  if (!s3.ok()) return Fail(s3.status());
  objstore::BucketGcOptions options;
  options.grace = std::chrono::seconds(static_cast<int64_t>(grace_seconds));
  auto r = objstore::BucketMirror::CollectGarbage(*s3->client, s3->location, options);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    PrintJson({{"store", s3->location.ToString()}, {"manifests_deleted", r->manifests_deleted},
               {"objects_deleted", r->objects_deleted}, {"bytes_deleted", r->bytes_deleted},
               {"objects_kept", r->objects_kept}, {"uploads_aborted", r->uploads_aborted}});
  } else {
    std::printf("gc of %s: %" PRIu64 " manifests and %" PRIu64 " objects (%" PRIu64
                " bytes) deleted, %" PRIu64 " objects kept, %" PRIu64 " uploads aborted\n",
                s3->location.ToString().c_str(), r->manifests_deleted, r->objects_deleted,
                r->bytes_deleted, r->objects_kept, r->uploads_aborted);
  }
  return kExitOk;
}

int Upgrade(const std::string& dir, bool json) {
  auto before = Store::ReadFormat(dir);
  if (!before.ok()) return Fail(before.status());
  StoreOptions options;
  options.create_if_missing = false;
  options.upgrade_format = true;
  auto store = OpenStore(dir, options);
  if (!store.ok()) return Fail(store.status());
  auto after = Store::ReadFormat(dir);
  if (!after.ok()) return Fail(after.status());
  if (json) {
    PrintJson({{"store", RealPath(dir)}, {"format_before", *before}, {"format", *after}});
  } else if (*before == *after) {
    std::printf("the store at %s has format %u already: nothing to do\n", dir.c_str(), *after);
  } else {
    std::printf("upgraded the store at %s from format %u to %u\n", dir.c_str(), *before, *after);
  }
  return kExitOk;
}

}  // namespace ckptfs::cli
