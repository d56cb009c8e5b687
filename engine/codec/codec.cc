#include "engine/codec/codec.h"

#include <lz4.h>
#include <zstd.h>

#include <charconv>
#include <climits>

#include "engine/codec/huffman.h"
#include "engine/codec/rans.h"
#include "engine/codec/zero_runs.h"

namespace ckptfs {

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kLz4:
      return "lz4";
    case Codec::kZstd:
      return "zstd";
    case Codec::kHuffman:
      return "huffman";
    case Codec::kRans:
      return "rans";
    case Codec::kZeroRuns:
      return "zero-runs";
  }
  return "unknown";
}

Result<CodecSpec> CodecSpec::Parse(std::string_view text) {
  if (text == "auto") return CodecSpec{};
  constexpr std::string_view kAutoPlus = "auto+";
  if (text.substr(0, kAutoPlus.size()) == kAutoPlus) {
    auto inner = Parse(text.substr(kAutoPlus.size()));
    if (!inner.ok() || inner->codec == Codec::kNone || text.substr(kAutoPlus.size()) == "auto") {
      return Status::InvalidArgument("bad codec '" + std::string(text) +
                                     "': use auto+lz4 or auto+zstd:LEVEL");
    }
    inner->entropy = true;
    return inner;
  }
  CodecSpec spec;
  spec.entropy = false;
  std::string_view name = text.substr(0, text.find(':'));
  if (name == "none") {
    spec.codec = Codec::kNone;
  } else if (name == "lz4") {
    spec.codec = Codec::kLz4;
  } else if (name == "zstd") {
    spec.codec = Codec::kZstd;
    spec.level = 3;
  } else {
    return Status::InvalidArgument("unknown codec '" + std::string(text) +
                                   "': use auto, none, lz4, zstd or zstd:LEVEL");
  }
  if (name.size() < text.size()) {
    std::string_view lvl = text.substr(name.size() + 1);
    int level = 0;
    auto [p, ec] = std::from_chars(lvl.data(), lvl.data() + lvl.size(), level);
    if (spec.codec != Codec::kZstd || ec != std::errc() || p != lvl.data() + lvl.size() ||
        level < 1 || level > ZSTD_maxCLevel()) {
      return Status::InvalidArgument(
          "bad codec '" + std::string(text) +
          "': only zstd takes a level, zstd:1 .. zstd:" + std::to_string(ZSTD_maxCLevel()));
    }
    spec.level = level;
  }
  return spec;
}

std::string CodecSpec::ToString() const {
  std::string inner = codec == Codec::kZstd ? "zstd:" + std::to_string(level > 0 ? level : 3)
                                            : std::string(CodecName(codec));
  if (!entropy || codec == Codec::kNone) return inner;
  return codec == Codec::kLz4 ? "auto" : "auto+" + inner;
}

namespace {

Codec StoreRaw(Bytes raw, Buffer* out) {
  out->Resize(raw.size());
  if (!raw.empty()) std::memcpy(out->data(), raw.data(), raw.size());
  return Codec::kNone;
}

// One zstd context per thread: creating one costs more than compressing a small chunk.
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> ctx(ZSTD_createCCtx(),
                                                                        ZSTD_freeCCtx);
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(),
                                                                        ZSTD_freeDCtx);
  return ctx.get();
}

}  // namespace

bool TryCompress(const CodecSpec& spec, Bytes raw, Buffer* out) {
  if (spec.codec == Codec::kNone || raw.empty() || raw.size() > INT_MAX / 2) return false;
  const char* src = reinterpret_cast<const char*>(raw.data());
  size_t n = 0;
  if (spec.codec == Codec::kHuffman) {
    return HuffmanEncode(raw, out);
  } else if (spec.codec == Codec::kLz4) {
    out->Resize(LZ4_compressBound(static_cast<int>(raw.size())));
    int got = LZ4_compress_default(src, reinterpret_cast<char*>(out->data()),
                                   static_cast<int>(raw.size()), static_cast<int>(out->size()));
    n = got > 0 ? static_cast<size_t>(got) : 0;
  } else {
    out->Resize(ZSTD_compressBound(raw.size()));
    size_t got = ZSTD_compressCCtx(ThreadCCtx(), out->data(), out->size(), src, raw.size(),
                                   spec.level > 0 ? spec.level : ZSTD_CLEVEL_DEFAULT);
    n = ZSTD_isError(got) ? 0 : got;
  }
  if (n == 0 || n >= raw.size()) return false;
  out->Resize(n);
  return true;
}

Codec Compress(const CodecSpec& spec, Bytes raw, Buffer* out) {
  if (TryCompress(spec, raw, out)) return spec.codec;
  return StoreRaw(raw, out);
}

Status Decompress(Codec codec, Bytes stored, MutableBytes out) {
  switch (codec) {
    case Codec::kNone:
      if (stored.size() != out.size()) return Status::Corruption("raw record has wrong length");
      if (!out.empty()) std::memcpy(out.data(), stored.data(), out.size());
      return Status::OK();
    case Codec::kLz4: {
      if (stored.size() > INT_MAX || out.size() > INT_MAX) {
        return Status::Corruption("lz4 record too large");
      }
      int got = LZ4_decompress_safe(reinterpret_cast<const char*>(stored.data()),
                                    reinterpret_cast<char*>(out.data()),
                                    static_cast<int>(stored.size()), static_cast<int>(out.size()));
      if (got < 0 || static_cast<size_t>(got) != out.size()) {
        return Status::Corruption("lz4 record does not decode to its recorded length");
      }
      return Status::OK();
    }
    case Codec::kZstd: {
      size_t got =
          ZSTD_decompressDCtx(ThreadDCtx(), out.data(), out.size(), stored.data(), stored.size());
      if (ZSTD_isError(got) || got != out.size()) {
        return Status::Corruption("zstd record does not decode to its recorded length");
      }
      return Status::OK();
    }
    case Codec::kHuffman:
      return HuffmanDecode(stored, out);
    case Codec::kRans:
      return RansDecode(stored, out);
    case Codec::kZeroRuns:
      return ZeroRunsDecode(stored, out);
  }
  return Status::Corruption("unknown codec " + std::to_string(static_cast<int>(codec)));
}

}  // namespace ckptfs
