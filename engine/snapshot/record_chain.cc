#include "engine/snapshot/record_chain.h"

#include <fcntl.h>

#include <string>
#include <vector>

#include "engine/codec/piece_codec.h"
#include "engine/store/record.h"

namespace ckptfs::snapshot {
namespace {
constexpr size_t kMaxChain = 255;  // as the store's readers
}  // namespace

Result<std::shared_ptr<FileDescriptor>> PackReader::Fd(uint32_t pack_id) {
  MutexLock lock(mu_);
  auto it = fds_.find(pack_id);
  if (it != fds_.end()) return it->second;
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(dir_ / PackFileName(pack_id), O_RDONLY));
  auto shared = std::make_shared<FileDescriptor>(std::move(fd));
  fds_.emplace(pack_id, shared);
  return shared;
}

Result<Buffer> PackReader::Read(const StoredRecord& top) {
  std::vector<const StoredRecord*> chain;  // top first, the whole record last
  for (const StoredRecord* r = &top; r != nullptr; r = r->base.get()) {
    if (chain.size() == kMaxChain) return Status::Corruption("delta chain too long");
    chain.push_back(r);
  }
  Buffer record, base;
  for (size_t i = chain.size(); i-- > 0;) {
    const StoredRecord& r = *chain[i];
    const std::filesystem::path path = dir_ / PackFileName(r.pack_id);
    const std::string where = path.string() + " offset " + std::to_string(r.offset);
    if (r.length < kRecordHeaderBytes ||
        r.length > kRecordHeaderBytes + kMaxRecordRawBytes + 1024) {
      return Status::Corruption(where + ": impossible record length");
    }
    CKPTFS_ASSIGN_OR_RETURN(auto fd, Fd(r.pack_id));
    record.Resize(r.length);
    CKPTFS_RETURN_IF_ERROR(PReadFull(fd->get(), r.offset, record.mutable_bytes(), path));
    auto h = RecordHeader::Decode(record.bytes());
    if (!h.ok()) return Status::Corruption(where + ": " + h.status().message());
    const Bytes payload = record.bytes().subspan(kRecordHeaderBytes);
    if (h->id != r.id || h->raw_len != r.raw_len || h->stored_len != payload.size() ||
        Checksum64(payload) != h->payload_checksum) {
      return Status::Corruption(where + ": not the record of chunk " + r.id.ShortHex() +
                                " (moved by gc, or damaged)");
    }
    auto body = SplitRecordPayload(*h, payload);
    if (!body.ok()) return Status::Corruption(where + ": " + body.status().message());
    if (body->base.has_value() != (r.base != nullptr) ||
        (body->base && *body->base != r.base->id)) {
      return Status::Corruption(where + ": chunk " + r.id.ShortHex() +
                                " names another delta base than the one it was written with");
    }
    Buffer raw(r.raw_len);
    Status s = DecodePiece({h->transform(), h->width(), h->codec}, body->encoded, base.bytes(),
                           raw.mutable_bytes());
    if (!s.ok()) return Status::Corruption(where + ": " + s.message());
    base = std::move(raw);
  }
  if (ChunkId::Of(base.bytes()) != top.id) {
    return Status::Corruption("chunk " + top.id.ShortHex() + " rebuilt to other bytes");
  }
  return base;
}

}  // namespace ckptfs::snapshot
