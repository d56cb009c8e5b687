#include "engine/store/record.h"

#include <cstdio>

#include "engine/util/coding.h"

namespace ckptfs {
namespace {
constexpr char kRecordMagic[4] = {'C', 'K', 'R', 'C'};
constexpr char kPackMagic[8] = {'C', 'K', 'P', 'T', 'P', 'A', 'C', 'K'};
constexpr uint8_t kRecordHeaderVersion = 1;
}  // namespace

RecordHeader RecordHeader::ForDelta(const ChunkId& id, uint32_t raw_len,
                                    const PieceEncoding& encoding, const ChunkId& base,
                                    Bytes encoded) {
  RecordHeader h = For(id, raw_len, encoding, {});
  h.stored_len = static_cast<uint32_t>(kChunkIdBytes + encoded.size());
  // XXH3-64 of base id + encoded: equal to Checksum64 of the joined payload.
  h.payload_checksum = Checksum64(
      Bytes(reinterpret_cast<const std::byte*>(base.bytes.data()), kChunkIdBytes), encoded);
  return h;
}

void RecordHeader::EncodeTo(std::byte out[kRecordHeaderBytes]) const {
  std::memcpy(out, kRecordMagic, 4);
  out[4] = std::byte{kRecordHeaderVersion};
  out[5] = static_cast<std::byte>(codec);
  PutLE<uint16_t>(out + 6, flags);
  PutLE<uint32_t>(out + 8, raw_len);
  PutLE<uint32_t>(out + 12, stored_len);
  std::memcpy(out + 16, id.bytes.data(), 32);
  PutLE<uint64_t>(out + 48, payload_checksum);
  PutLE<uint64_t>(out + 56, Checksum64({out, 56}));
}

Result<RecordHeader> RecordHeader::Decode(Bytes in) {
  if (in.size() < kRecordHeaderBytes) return Status::Corruption("record header is truncated");
  const std::byte* p = in.data();
  if (std::memcmp(p, kRecordMagic, 4) != 0) return Status::Corruption("bad record magic");
  if (GetLE<uint64_t>(p + 56) != Checksum64({p, 56})) {
    return Status::Corruption("record header checksum mismatch");
  }
  if (static_cast<uint8_t>(p[4]) != kRecordHeaderVersion) {
    return Status::Corruption("unknown record header version " +
                              std::to_string(static_cast<int>(p[4])));
  }
  RecordHeader h;
  uint8_t codec = static_cast<uint8_t>(p[5]);
  if (codec > static_cast<uint8_t>(Codec::kZstd)) {
    return Status::Corruption("unknown codec " + std::to_string(codec));
  }
  h.codec = static_cast<Codec>(codec);
  h.flags = GetLE<uint16_t>(p + 6);
  if ((h.flags & 0xff80) != 0 || h.transform() > Transform::kSub) {
    return Status::Corruption("record flags name an unknown encoding");
  }
  h.raw_len = GetLE<uint32_t>(p + 8);
  h.stored_len = GetLE<uint32_t>(p + 12);
  std::memcpy(h.id.bytes.data(), p + 16, 32);
  h.payload_checksum = GetLE<uint64_t>(p + 48);
  if (h.raw_len > kMaxRecordRawBytes || h.stored_len > kMaxRecordRawBytes + 1024) {
    return Status::Corruption("record length out of bounds");
  }
  return h;
}

Result<RecordBody> SplitRecordPayload(const RecordHeader& header, Bytes payload) {
  if (!IsDelta(header.transform())) return RecordBody{std::nullopt, payload};
  if (payload.size() < kChunkIdBytes) return Status::Corruption("delta record is truncated");
  ChunkId base;
  std::memcpy(base.bytes.data(), payload.data(), kChunkIdBytes);
  return RecordBody{base, payload.subspan(kChunkIdBytes)};
}

Buffer JoinDeltaPayload(const ChunkId& base, Bytes encoded) {
  Buffer out(kChunkIdBytes + encoded.size());
  std::memcpy(out.data(), base.bytes.data(), kChunkIdBytes);
  if (!encoded.empty()) std::memcpy(out.data() + kChunkIdBytes, encoded.data(), encoded.size());
  return out;
}

void EncodePackHeader(uint32_t pack_id, std::byte out[kPackHeaderBytes], PackLane lane) {
  std::memset(out, 0, kPackHeaderBytes);
  std::memcpy(out, kPackMagic, 8);
  PutLE<uint32_t>(out + 8, kPackFormatVersion);
  PutLE<uint32_t>(out + 12, pack_id);
  out[16] = static_cast<std::byte>(lane);
  PutLE<uint64_t>(out + 24, Checksum64({out, 24}));
}

Status CheckPackHeader(Bytes in, uint32_t pack_id) {
  if (in.size() < kPackHeaderBytes || std::memcmp(in.data(), kPackMagic, 8) != 0 ||
      GetLE<uint64_t>(in.data() + 24) != Checksum64(in.first(24))) {
    return Status::Corruption("pack header is damaged");
  }
  if (GetLE<uint32_t>(in.data() + 8) != kPackFormatVersion) {
    return Status::NotSupported("pack format version " +
                                std::to_string(GetLE<uint32_t>(in.data() + 8)) +
                                " is newer than this ckptfs supports; upgrade ckptfs");
  }
  if (GetLE<uint32_t>(in.data() + 12) != pack_id) {
    return Status::Corruption("pack header names another pack id");
  }
  return Status::OK();
}

PackLane PackLaneOf(Bytes header) {
  if (header.size() < kPackHeaderBytes) return PackLane::kMain;
  const auto lane = static_cast<uint8_t>(header[16]);
  return lane < kPackLanes ? static_cast<PackLane>(lane) : PackLane::kMain;
}

std::string PackFileName(uint32_t pack_id) {
  char name[32];
  std::snprintf(name, sizeof(name), "%06u.pack", pack_id);
  return name;
}

bool ParsePackFileName(const std::string& name, uint32_t* pack_id) {
  if (name.size() < 6 || name.substr(name.size() - 5) != ".pack") return false;
  std::string digits = name.substr(0, name.size() - 5);
  if (digits.empty() || digits.size() > 9) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  *pack_id = static_cast<uint32_t>(std::stoul(digits));
  return true;
}

}  // namespace ckptfs
