// scripts/bench/engine_bench.cc
//
// The engine benchmark. On real checkpoint bytes (scripts/bench/engine.sh makes them with torch)
// it measures, and prints as tables:
//
//   1. per core (one thread): FastCDC, SHA-256 (ChunkId::Of), XXH3 (Checksum64), lz4 and zstd:3
//      compress/decompress (engine/codec), with compression ratios;
//   2. end to end: Store ingest (ContentWriter Append+Finish, durable) against writing the same
//      bytes to a plain file with and without fdatasync; Store::Read of the whole content, cold
//      and warm, against reading the plain file;
//   3. hash candidates for chunk ids (OpenSSL EVP digests, XXH3-128 as a non-cryptographic
//      reference, BLAKE3 through the b3sum CLI when it is installed);
//   4. chunk-size settings: chunking throughput, chunk count (metadata), and the bytes a second
//      version adds (v2: one more step with half the layers frozen; v1 with bytes inserted).
//
// Every number is the median of --runs runs, with the range in brackets. Paired measurements
// (the store against a plain file, a hash against SHA-256) are taken in the same run, and the
// ratio shown is the median of the per-run ratios. GB/s means 10^9 bytes per second.
//
// Usage: engine_bench --v1 FILE --dir DIR [--v2 FILE] [--runs N] [--only
// micro,e2e,hash,codec,chunk] [--codecs auto,lz4,...] [--no-format-aware]
// [--vector-level avx512|avx2|baseline]
//   DIR: scratch directory on the disk to measure (the bench removes what it creates there).
//   --vector-level: the codec's loops at most at that level (engine/codec/vector_level.h), as
//   on a CPU without AVX-512 (or AVX2): the same bytes stored, other loops timed.
#include <fcntl.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "engine/chunk/fastcdc.h"
#include "engine/codec/codec.h"
#include "engine/codec/piece_codec.h"
#include "engine/codec/vector_level.h"
#include "engine/format/layout.h"
#include "engine/hash/chunk_id.h"
#include "engine/store/content_reader.h"
#include "engine/store/content_writer.h"
#include "engine/store/record.h"
#include "engine/store/store.h"
#include "engine/util/buffer.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kIoBytes = 4 << 20;           // the pieces the CLI writes and reads in
constexpr uint64_t kReadaheadBytes = 8 << 20;  // the filesystem's default (namespace/filesystem.h)

volatile uint64_t g_sink = 0;  // keeps results alive so the work cannot be optimised away

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "engine_bench: %s\n", what.c_str());
  std::exit(1);
}
void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}
template <typename T>
T Unwrap(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what + ": " + r.status().ToString());
  return std::move(*r);
}

std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// The CPU, as /proc/cpuinfo names it, with its family and model numbers (a VM's "AMD EPYC" says
// neither the generation nor the core; speeds per core are only comparable on the same one).
std::string CpuName() {
  std::string name = "unknown CPU", family, model;
  int processors = 0;
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return name;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    std::string l(line);
    const size_t colon = l.find(':');
    if (colon == std::string::npos) continue;
    std::string key = l.substr(0, l.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = l.substr(std::min(l.size(), colon + 2));
    while (!value.empty() && (value.back() == '\n' || value.back() == ' ')) value.pop_back();
    if (key == "model name") name = value;
    if (key == "cpu family") family = value;
    if (key == "model") model = value;
    if (key == "processor" && processors++ > 0) break;  // the first CPU's lines only
  }
  std::fclose(f);
  return family.empty()
             ? name
             : Fmt("%s (family %s model %s)", name.c_str(), family.c_str(), model.c_str());
}

double Seconds(const std::function<void()>& fn) {
  auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Throughputs in GB/s of `bytes` done in each of `secs`.
std::vector<double> Rates(uint64_t bytes, const std::vector<double>& secs) {
  std::vector<double> out;
  for (double s : secs) out.push_back(static_cast<double>(bytes) / 1e9 / s);
  return out;
}
std::vector<double> Ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) out.push_back(a[i] / b[i]);
  return out;
}

std::string Value(const std::vector<double>& v, const char* unit, int decimals = 2) {
  return Fmt("%.*f %s", decimals, Median(v), unit);
}
std::string Range(const std::vector<double>& v, int decimals = 2) {
  if (v.size() < 2) return "(1 run)";
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return Fmt("[%.*f .. %.*f]", decimals, *lo, decimals, *hi);
}

// A text table: rows of cells, with section titles between them.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void Section(const std::string& title) { rows_.push_back({"#" + title}); }
  void Add(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void Note(const std::string& note) { notes_.push_back(note); }
  void Print(const std::string& title) const {
    std::vector<size_t> width(header_.size(), 0);
    auto widen = [&](const std::vector<std::string>& cells) {
      for (size_t i = 0; i < cells.size() && i < width.size(); ++i) {
        width[i] = std::max(width[i], cells[i].size());
      }
    };
    widen(header_);
    for (const auto& r : rows_) {
      if (r.size() != 1 || r[0].empty() || r[0][0] != '#') widen(r);
    }
    size_t total = 0;
    for (size_t w : width) total += w + 3;
    auto line = [&](const std::vector<std::string>& cells) {
      std::string out;
      for (size_t i = 0; i < width.size(); ++i) {
        std::string cell = i < cells.size() ? cells[i] : "";
        out += cell + std::string(width[i] - std::min(width[i], cell.size()) + 3, ' ');
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
      std::printf("%s\n", out.c_str());
    };
    std::printf("\n== %s\n", title.c_str());
    line(header_);
    std::printf("%s\n", std::string(total, '-').c_str());
    for (const auto& r : rows_) {
      if (r.size() == 1 && !r[0].empty() && r[0][0] == '#') {
        std::printf("-- %s\n", r[0].c_str() + 1);
      } else {
        line(r);
      }
    }
    for (const auto& n : notes_) std::printf("  * %s\n", n.c_str());
    std::fflush(stdout);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> notes_;
};

Buffer ReadWholeFile(const fs::path& path) {
  FileDescriptor fd = Unwrap(OpenFile(path, O_RDONLY), "open");
  uint64_t size = Unwrap(FileSize(fd.get(), path), "stat");
  Buffer buf(size);
  Check(PReadFull(fd.get(), 0, buf.mutable_bytes(), path), "read");
  return buf;
}

struct Span {
  size_t offset = 0;
  size_t length = 0;
};

std::vector<Span> CutAll(Bytes data, const FastCdc::Params& params) {
  FastCdc cdc(params);
  std::vector<Span> spans;
  size_t start = 0, pos = 0;
  while (pos < data.size()) {
    pos += cdc.Scan(data.subspan(pos));
    if (cdc.AtCut()) {
      spans.push_back({start, pos - start});
      start = pos;
    }
  }
  if (pos > start) spans.push_back({start, pos - start});
  return spans;
}

std::vector<Span> CutFixed(size_t size, size_t block) {
  std::vector<Span> spans;
  for (size_t off = 0; off < size; off += block)
    spans.push_back({off, std::min(block, size - off)});
  return spans;
}

FastCdc::Params ParamsFor(size_t avg) { return {avg / 4, avg, avg * 4}; }

std::string SizeName(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return Fmt("%zuM", bytes >> 20);
  return Fmt("%zuK", bytes >> 10);
}

// ----------------------------------------------------------------------------------------------
// 1. Per-core stages.

struct MicroResult {
  double write_path_gbps = 0;
  double read_path_gbps = 0;
};

MicroResult RunMicro(Bytes data, int runs, TextTable* t) {
  const uint64_t n = data.size();
  const std::vector<Span> chunks = CutAll(data, FastCdc::Params{});
  Buffer dst(n);
  std::memset(dst.data(), 0, n);  // fault the pages in before timing
  // Runs fn once to warm up, then `runs` times; returns the timed seconds.
  auto measure = [&](const std::function<void()>& fn) {
    fn();
    std::vector<double> secs;
    for (int i = 0; i < runs; ++i) secs.push_back(Seconds(fn));
    return secs;
  };
  auto per_chunk = [&](const std::function<void(Bytes)>& fn) {
    return [&, fn] {
      for (const Span& c : chunks) fn(data.subspan(c.offset, c.length));
    };
  };

  t->Section(
      Fmt("per core, one thread, on %.1f MB of fp32 torch checkpoint bytes, %zu chunks "
          "(default FastCDC)",
          n / 1e6, chunks.size()));
  auto s_memcpy = measure([&] { std::memcpy(dst.data(), data.data(), n); });
  t->Add(
      {"memcpy (reference)", Value(Rates(n, s_memcpy), "GB/s"), Range(Rates(n, s_memcpy)), "", ""});

  auto s_cdc = measure([&] {
    FastCdc cdc(FastCdc::Params{});
    uint64_t cuts = 0;
    for (size_t pos = 0; pos < n;) {
      pos += cdc.Scan(data.subspan(pos));
      cuts += cdc.AtCut();
    }
    g_sink = g_sink + cuts;
  });
  t->Add({"FastCDC 256K/1M/4M (chunk/fastcdc.h)", Value(Rates(n, s_cdc), "GB/s"),
          Range(Rates(n, s_cdc)), "", ""});

  auto s_sha = measure(per_chunk([](Bytes c) { g_sink = g_sink + ChunkId::Of(c).bytes[0]; }));
  t->Add({"SHA-256, ChunkId::Of (OpenSSL, SHA-NI)", Value(Rates(n, s_sha), "GB/s"),
          Range(Rates(n, s_sha)), "", ""});
  auto s_xxh = measure(per_chunk([](Bytes c) { g_sink = g_sink + Checksum64(c); }));
  t->Add({"XXH3-64, Checksum64", Value(Rates(n, s_xxh), "GB/s"), Range(Rates(n, s_xxh)), "", ""});

  struct CodecRun {
    std::vector<double> comp, decomp;
  };
  auto codec_run = [&](const CodecSpec& spec, const char* label, const char* ctarget,
                       const char* dtarget, double cmin, double dmin) {
    std::vector<Buffer> outs(chunks.size());
    std::vector<Codec> used(chunks.size());
    CodecRun r;
    r.comp = measure([&] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        used[i] = Compress(spec, data.subspan(chunks[i].offset, chunks[i].length), &outs[i]);
      }
    });
    r.decomp = measure([&] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        Check(Decompress(used[i], outs[i].bytes(),
                         dst.mutable_bytes().subspan(chunks[i].offset, chunks[i].length)),
              "decompress");
      }
    });
    if (std::memcmp(dst.data(), data.data(), n) != 0) Die(std::string(label) + " round trip");
    uint64_t stored = 0, raw_chunks = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      stored += outs[i].size();
      raw_chunks += used[i] == Codec::kNone;
    }
    auto verdict = [](const std::vector<double>& rates, double min, const char* target) {
      if (min <= 0) return std::string();
      return Fmt("%s: %s", target, Median(rates) >= min ? "met" : "MISSED");
    };
    auto cr = Rates(n, r.comp), dr = Rates(n, r.decomp);
    std::string ratio = Fmt("ratio %.3fx (%.1f%% of chunks stored raw)",
                            static_cast<double>(n) / static_cast<double>(stored),
                            100.0 * static_cast<double>(raw_chunks) / chunks.size());
    t->Add({Fmt("%s compress", label), Value(cr, "GB/s"), Range(cr), ratio,
            verdict(cr, cmin, ctarget)});
    t->Add({Fmt("%s decompress", label), Value(dr, "GB/s"), Range(dr), "",
            verdict(dr, dmin, dtarget)});
    if (raw_chunks > 0 && raw_chunks < chunks.size()) {
      // Decompressing a raw record is a memcpy: this is the codec's own speed.
      uint64_t shrunk = 0;
      for (size_t i = 0; i < chunks.size(); ++i)
        shrunk += used[i] != Codec::kNone ? chunks[i].length : 0;
      auto secs = measure([&] {
        for (size_t i = 0; i < chunks.size(); ++i) {
          if (used[i] == Codec::kNone) continue;
          Check(Decompress(used[i], outs[i].bytes(),
                           dst.mutable_bytes().subspan(chunks[i].offset, chunks[i].length)),
                "decompress");
        }
      });
      auto sr = Rates(shrunk, secs);
      t->Add({Fmt("%s decompress, only the chunks it shrank", label), Value(sr, "GB/s"), Range(sr),
              Fmt("%.1f MB of raw bytes", shrunk / 1e6), verdict(sr, dmin, dtarget)});
    }
    return r;
  };
  CodecRun lz4 = codec_run(CodecSpec{Codec::kLz4, 0}, "lz4", ">= 1 GB/s", ">= 2 GB/s", 1.0, 2.0);
  codec_run(CodecSpec{Codec::kZstd, 3}, "zstd:3", "", "", 0, 0);

  // The whole per-chunk work of one core, from the stage medians: a chunk is cut, hashed,
  // compressed and checksummed on write; checksummed and decompressed on read.
  MicroResult m;
  double w = Median(s_cdc) + Median(s_sha) + Median(lz4.comp) + Median(s_xxh);
  double r = Median(s_xxh) + Median(lz4.decomp);
  m.write_path_gbps = n / 1e9 / w;
  m.read_path_gbps = n / 1e9 / r;
  t->Add({"write path per core: CDC+SHA-256+lz4+XXH3", Fmt("%.2f GB/s", m.write_path_gbps),
          "(sum of stage medians)", "", ""});
  t->Add({"read path per core: XXH3+lz4 decompress", Fmt("%.2f GB/s", m.read_path_gbps),
          "(sum of stage medians)", "", ""});
  return m;
}

// ----------------------------------------------------------------------------------------------
// 2. End to end, on the disk under `dir`.

// Drops the page cache (as root), else evicts `files` with fadvise. Says which it did.
std::string DropCaches(const std::vector<fs::path>& files) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd >= 0) {
    bool ok = ::write(fd, "3\n", 2) == 2;
    ::close(fd);
    if (ok) return "drop_caches";
  }
  for (const auto& f : files) {
    int ffd = ::open(f.c_str(), O_RDONLY);
    if (ffd < 0) continue;
    ::posix_fadvise(ffd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(ffd);
  }
  return "fadvise(DONTNEED) (drop_caches refused)";
}

std::vector<fs::path> StoreFiles(const fs::path& store) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(store)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  return files;
}

// Wall and CPU seconds of one operation. CPU time is the whole process's (user + system, all
// threads, the store's workers and io_uring's included): on a shared machine it is steadier
// than wall time, and it says what the operation would cost with the cores to itself.
struct Cost {
  double wall = 0;
  double cpu = 0;
};

double CpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto secs = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return secs(ru.ru_utime) + secs(ru.ru_stime);
}

Cost Measure(const std::function<void()>& fn) {
  double c0 = CpuSeconds();
  double wall = Seconds(fn);
  return {wall, CpuSeconds() - c0};
}

// Writes data to a new file; durable when `sync` (fdatasync of the file and fsync of its
// directory, which a new file needs to survive a crash).
Cost PlainWrite(const fs::path& path, Bytes data, bool sync) {
  fs::remove(path);
  ::sync();
  return Measure([&] {
    FileDescriptor fd = Unwrap(OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC), "create");
    for (size_t off = 0; off < data.size(); off += kIoBytes) {
      Check(
          PWriteFull(fd.get(), off, data.subspan(off, std::min(kIoBytes, data.size() - off)), path),
          "write");
    }
    if (sync) {
      Check(DataSync(fd.get(), path), "fdatasync");
      Check(SyncDir(path.parent_path()), "fsync dir");
    }
  });
}

Cost PlainRead(const fs::path& path, MutableBytes out) {
  return Measure([&] {
    FileDescriptor fd = Unwrap(OpenFile(path, O_RDONLY), "open");
    for (size_t off = 0; off < out.size(); off += kIoBytes) {
      Check(PReadFull(fd.get(), off, out.subspan(off, std::min(kIoBytes, out.size() - off)), path),
            "read");
    }
  });
}

// Dirty page-cache bytes not yet written back, machine-wide (/proc/meminfo Dirty).
uint64_t DirtyBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long v = 0;
    if (std::sscanf(line, "Dirty: %llu kB", &v) == 1) kb = v;
  }
  std::fclose(f);
  return kb << 10;
}

// Stores data as one content. *append_secs gets the wall time of the Append calls alone (the
// pipeline runs behind them; Finish drains it, syncs the pack and commits), *dirty the dirty
// page-cache bytes when they return (what Finish's fdatasync still has to write).
Cost Ingest(Store* store, Bytes data, ContentId* id, double* append_secs = nullptr,
            uint64_t* dirty = nullptr) {
  double c0 = CpuSeconds();
  auto t0 = Clock::now();
  auto w = store->NewWriter();
  for (size_t off = 0; off < data.size(); off += kIoBytes) {
    Check(w->Append(data.subspan(off, std::min(kIoBytes, data.size() - off))), "append");
  }
  auto t1 = Clock::now();
  if (dirty != nullptr) *dirty = DirtyBytes();
  *id = Unwrap(w->Finish(), "finish");
  auto t2 = Clock::now();
  if (append_secs != nullptr) *append_secs = std::chrono::duration<double>(t1 - t0).count();
  return {std::chrono::duration<double>(t2 - t0).count(), CpuSeconds() - c0};
}

Cost StoreRead(const Store& store, ContentId id, MutableBytes out) {
  return Measure([&] {
    for (size_t off = 0; off < out.size();) {
      size_t got = Unwrap(
          store.Read(id, off, out.subspan(off, std::min(kIoBytes, out.size() - off))), "read");
      if (got == 0) Die("short store read");
      off += got;
    }
  });
}

// The same through a ContentReader, which prefetches ahead of sequential reads on the pool.
Cost ReaderRead(const Store& store, ContentId id, MutableBytes out) {
  ContentReader reader(&store, id, kReadaheadBytes);
  return Measure([&] {
    for (size_t off = 0; off < out.size();) {
      size_t got =
          Unwrap(reader.Read(off, out.subspan(off, std::min(kIoBytes, out.size() - off))), "read");
      if (got == 0) Die("short reader read");
      off += got;
    }
  });
}

// --no-format-aware: plain FastCDC, without the torch zip cuts (for comparison).
bool g_format_aware = true;

StoreOptions BenchOptions() {
  StoreOptions options;
  options.format_aware_chunking = g_format_aware;
  return options;
}

std::unique_ptr<Store> OpenStore(const fs::path& dir) {
  return Unwrap(Store::Open(dir, BenchOptions()), "open store " + dir.string());
}

// Wall and CPU times of repeated runs of one operation.
struct Costs {
  std::vector<double> wall, cpu;
  void Add(const Cost& c) {
    wall.push_back(c.wall);
    cpu.push_back(c.cpu);
  }
  // CPU seconds per GB.
  std::vector<double> CpuPerGb(uint64_t bytes) const {
    std::vector<double> out;
    for (double c : cpu) out.push_back(c / (bytes / 1e9));
    return out;
  }
};

struct E2eResult {
  uint64_t v2_added_record_bytes = 0;
  bool have_v2 = false;
};

E2eResult RunE2e(Bytes v1, const Buffer* v2, const fs::path& dir, int runs, TextTable* t) {
  const uint64_t n = v1.size();
  const fs::path plain = dir / "plain.bin";
  const fs::path store_dir = dir / "store";
  Costs ingest, ingest2, sync, nosync;
  std::vector<double> s_append, dirty_mb;
  ContentId id = 0;
  bool uring = false;
  StoreStats st1, st2;
  for (int r = 0; r < runs; ++r) {
    // v1 into a fresh store, then v2 (half of it already stored) into the same store.
    auto run_ingest = [&] {
      fs::remove_all(store_dir);
      ::sync();
      auto store = OpenStore(store_dir);
      uring = store->using_io_uring();
      double append = 0;
      uint64_t dirty = 0;
      ingest.Add(Ingest(store.get(), v1, &id, &append, &dirty));
      s_append.push_back(append);
      dirty_mb.push_back(dirty / 1e6);
      st1 = Unwrap(store->Stats(), "stats");
      if (v2 != nullptr) {
        ContentId id2;
        ::sync();
        ingest2.Add(Ingest(store.get(), v2->bytes(), &id2));
        st2 = Unwrap(store->Stats(), "stats");
        Check(store->Release(id2), "release v2");  // the reads below are of v1 alone
      }
    };
    // Alternate the order, so that neither side always runs right after the other's writeback.
    if (r % 2 == 0) {
      sync.Add(PlainWrite(plain, v1, true));
      run_ingest();
    } else {
      run_ingest();
      sync.Add(PlainWrite(plain, v1, true));
    }
    nosync.Add(PlainWrite(plain, v1, false));
    ::sync();
  }
  t->Section(
      Fmt("end to end, %.1f MB, default StoreOptions (lz4, FastCDC %zuK/%zuK/%zuK, "
          "format-aware %s, %u workers, %s), pieces of 4 MiB, on %s",
          n / 1e6, FastCdc::Params{}.min_size >> 10, FastCdc::Params{}.avg_size >> 10,
          FastCdc::Params{}.max_size >> 10, g_format_aware ? "on" : "off",
          std::max(1u, std::thread::hardware_concurrency()), uring ? "io_uring" : "pwrite",
          dir.c_str()));
  auto ri = Rates(n, ingest.wall), rs = Rates(n, sync.wall), rn = Rates(n, nosync.wall);
  auto vs_sync = Ratios(ri, rs), vs_nosync = Ratios(ri, rn);
  t->Add({"plain file write + fdatasync (peer)", Value(rs, "GB/s"), Range(rs), "", ""});
  t->Add({"plain file write, no sync (page cache)", Value(rn, "GB/s"), Range(rn), "", ""});
  t->Add({"Store ingest v1 (Append+Finish, durable)", Value(ri, "GB/s"), Range(ri),
          Fmt("%.2fx plain durable %s, %.2fx no-sync", Median(vs_sync), Range(vs_sync).c_str(),
              Median(vs_nosync)),
          Fmt(">= 0.8x plain durable: %s", Median(vs_sync) >= 0.8 ? "met" : "MISSED")});
  {
    std::vector<double> finish;
    for (size_t i = 0; i < ingest.wall.size(); ++i) finish.push_back(ingest.wall[i] - s_append[i]);
    t->Add({"  of which: Append calls (chunk, hash, compress)", Value(s_append, "s"),
            Range(s_append),
            Fmt("%.0f MB still dirty in the page cache when they return %s", Median(dirty_mb),
                Range(dirty_mb, 0).c_str()),
            ""});
    t->Add({"  of which: Finish (drain, fdatasync, commit)", Value(finish, "s"), Range(finish),
            Fmt("plain durable write: %.2f s in all", Median(sync.wall)), ""});
    auto ci = ingest.CpuPerGb(n), cs = sync.CpuPerGb(n);
    t->Add({"  CPU of the ingest (all threads)", Value(ci, "CPU-s/GB"), Range(ci),
            Fmt("plain durable write: %.2f CPU-s/GB; 2 idle cores would allow %.2f GB/s",
                Median(cs), 2 / Median(ci)),
            ""});
  }

  E2eResult result;
  t->Note(Fmt("v1 in the store: %llu chunks, %.1f MB of records (lz4 %.3fx)",
              static_cast<unsigned long long>(st1.chunks), st1.record_bytes / 1e6,
              static_cast<double>(n) / st1.record_bytes));
  if (v2 != nullptr) {
    result.have_v2 = true;
    result.v2_added_record_bytes = st2.record_bytes - st1.record_bytes;
    auto r2 = Rates(v2->size(), ingest2.wall);
    auto vs = Ratios(r2, rs);
    t->Add({"Store ingest v2 into the store holding v1", Value(r2, "GB/s"), Range(r2),
            Fmt("%.2fx plain durable %s; +%.1f MB of records, +%llu chunks", Median(vs),
                Range(vs).c_str(), result.v2_added_record_bytes / 1e6,
                static_cast<unsigned long long>(st2.chunks - st1.chunks)),
            ""});
  }

  Buffer out(n);
  std::memset(out.data(), 0, n);
  Costs pc, sc, rc, pw, sw, sw2, rw;
  std::string how;
  for (int r = 0; r < runs; ++r) {
    std::vector<fs::path> files = StoreFiles(store_dir);
    files.push_back(plain);
    how = DropCaches(files);
    pc.Add(PlainRead(plain, out.mutable_bytes()));
    how = DropCaches(files);
    {
      auto store = OpenStore(store_dir);  // fresh: its decoded-chunk cache is empty
      sc.Add(StoreRead(*store, id, out.mutable_bytes()));
    }
    if (std::memcmp(out.data(), v1.data(), n) != 0) Die("store read returned wrong bytes");
    how = DropCaches(files);
    {
      auto store = OpenStore(store_dir);
      rc.Add(ReaderRead(*store, id, out.mutable_bytes()));
    }
    if (std::memcmp(out.data(), v1.data(), n) != 0) Die("reader returned wrong bytes");
    // Warm: the page cache holds the file and the packs now.
    pw.Add(PlainRead(plain, out.mutable_bytes()));
    {
      auto store = OpenStore(store_dir);
      sw.Add(StoreRead(*store, id, out.mutable_bytes()));
      // A second pass in the same store: its cache is full (of chunks that a sequential pass
      // evicts before it needs them again), so this is the steady state of a long-lived store.
      sw2.Add(StoreRead(*store, id, out.mutable_bytes()));
      rw.Add(ReaderRead(*store, id, out.mutable_bytes()));
    }
    if (std::memcmp(out.data(), v1.data(), n) != 0) Die("store read returned wrong bytes");
  }
  auto read_row = [&](const char* name, const Costs& c, const Costs* peer, const char* peer_name) {
    auto rates = Rates(n, c.wall);
    std::string vs = Fmt("%.2f CPU-s/GB", Median(c.CpuPerGb(n)));
    if (peer != nullptr) {
      auto ratio = Ratios(rates, Rates(n, peer->wall));
      vs = Fmt("%.2fx %s %s; ", Median(ratio), peer_name, Range(ratio).c_str()) + vs;
    }
    t->Add({name, Value(rates, "GB/s"), Range(rates), vs, ""});
  };
  read_row("plain file read, cold (peer)", pc, nullptr, "");
  read_row("Store::Read whole content, cold", sc, &pc, "plain cold");
  read_row("ContentReader (8 MiB prefetch), cold", rc, &pc, "plain cold");
  read_row("plain file read, warm (peer)", pw, nullptr, "");
  read_row("Store::Read whole content, warm, fresh store", sw, &pw, "plain warm");
  read_row("Store::Read whole content, warm, 2nd pass", sw2, &pw, "plain warm");
  read_row("ContentReader (8 MiB prefetch), warm, 3rd pass", rw, &pw, "plain warm");
  t->Note("cold: page cache dropped with " + how +
          " before each cold read, store opened fresh. warm, fresh store: page cache warm, "
          "decoded-chunk cache empty and being filled (fresh memory, page faults). 2nd pass: the "
          "same store again; a 256 MiB LRU cannot hold this content, so all misses again, but "
          "its memory is recycled: the steady state of a long-lived store");
  t->Note(
      "plain durable write = create, write, fdatasync, fsync(dir); the store's ingest "
      "includes creating its first pack (header, fdatasync, fsync(dir)) and the LMDB commit");
  fs::remove_all(store_dir);
  fs::remove(plain);
  return result;
}

// ----------------------------------------------------------------------------------------------
// 3. Hash candidates for chunk ids.

void RunHashes(Bytes data, const fs::path& file, int runs, TextTable* t) {
  const uint64_t n = data.size();
  const std::vector<Span> chunks = CutAll(data, FastCdc::Params{});
  auto over_chunks = [&](const std::function<void(Bytes)>& fn) {
    return Seconds([&] {
      for (const Span& c : chunks) fn(data.subspan(c.offset, c.length));
    });
  };
  auto sha = [](Bytes c) { g_sink = g_sink + ChunkId::Of(c).bytes[0]; };

  struct Candidate {
    std::string label;
    std::function<void(Bytes)> fn;
    EVP_MD* md = nullptr;
  };
  std::vector<Candidate> cands;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const std::pair<const char*, const char*> evp[] = {
      {"SHA2-256", "SHA-256 via EVP (same code as ChunkId)"},
      {"SHA2-512/256", "SHA-512/256 via EVP"},
      {"BLAKE2B-512", "BLAKE2b-512 via EVP"},
      {"BLAKE2S-256", "BLAKE2s-256 via EVP"},
      {"SHA3-256", "SHA3-256 via EVP"},
  };
  for (const auto& [name, label] : evp) {
    EVP_MD* md = EVP_MD_fetch(nullptr, name, nullptr);
    if (md == nullptr) {
      t->Note(Fmt("%s: not available in this OpenSSL", name));
      continue;
    }
    cands.push_back({label,
                     [ctx, md](Bytes c) {
                       unsigned char out[EVP_MAX_MD_SIZE];
                       unsigned int len = 0;
                       EVP_DigestInit_ex2(ctx, md, nullptr);
                       EVP_DigestUpdate(ctx, c.data(), c.size());
                       EVP_DigestFinal_ex(ctx, out, &len);
                       g_sink = g_sink + out[0];
                     },
                     md});
  }
  cands.push_back({"XXH3-128 (not cryptographic: reference only)",
                   [](Bytes c) { g_sink = g_sink + XXH3_128bits(c.data(), c.size()).low64; }});

  t->Section(Fmt("chunk-id hash candidates, one thread, over the %zu default chunks of %.1f MB",
                 chunks.size(), n / 1e6));
  std::vector<double> base;
  std::vector<std::vector<double>> secs(cands.size());
  over_chunks(sha);  // warm up
  for (int r = 0; r < runs; ++r) {
    base.push_back(over_chunks(sha));
    for (size_t i = 0; i < cands.size(); ++i) secs[i].push_back(over_chunks(cands[i].fn));
  }
  auto rb = Rates(n, base);
  t->Add({"SHA-256, ChunkId::Of (the engine's choice)", Value(rb, "GB/s"), Range(rb), "1.00x", ""});
  for (size_t i = 0; i < cands.size(); ++i) {
    auto rr = Rates(n, secs[i]);
    auto ratio = Ratios(rr, rb);
    t->Add({cands[i].label, Value(rr, "GB/s"), Range(rr),
            Fmt("%.2fx SHA-256 %s", Median(ratio), Range(ratio).c_str()), ""});
  }
  for (auto& c : cands) EVP_MD_free(c.md);
  EVP_MD_CTX_free(ctx);

  // BLAKE3 has no C library in Debian 12 (no libblake3-dev); its CLI b3sum is packaged. Time
  // it against `openssl dgst -sha256` on the same file (in the page cache), same method both.
  if (std::system("command -v b3sum >/dev/null 2>&1") == 0) {
    std::string b3 = Fmt("b3sum --num-threads 1 --no-names '%s' >/dev/null", file.c_str());
    std::string ssl = Fmt("openssl dgst -sha256 '%s' >/dev/null", file.c_str());
    auto run = [](const std::string& cmd) {
      return Seconds([&] {
        if (std::system(cmd.c_str()) != 0) Die("failed: " + cmd);
      });
    };
    run(b3);
    run(ssl);
    std::vector<double> sb, ss;
    for (int r = 0; r < runs; ++r) {
      sb.push_back(run(b3));
      ss.push_back(run(ssl));
    }
    uint64_t size = fs::file_size(file);
    auto rb3 = Rates(size, sb), rss = Rates(size, ss), ratio = Ratios(rb3, rss);
    t->Add({"SHA-256 CLI: openssl dgst -sha256 FILE", Value(rss, "GB/s"), Range(rss), "", ""});
    t->Add({"BLAKE3 CLI: b3sum --num-threads 1 FILE", Value(rb3, "GB/s"), Range(rb3),
            Fmt("%.2fx openssl dgst %s", Median(ratio), Range(ratio).c_str()), ""});
    t->Note(
        "CLI rows hash the whole file in one process each (startup and page-cache copies "
        "included); compare them with each other, not with the in-process rows");
  } else {
    t->Note("b3sum not installed: no BLAKE3 row (apt-get install b3sum to add it)");
  }
}

// ----------------------------------------------------------------------------------------------
// 4. Chunk sizes.

struct Dedup {
  uint64_t new_chunks = 0;
  uint64_t new_raw = 0;
  uint64_t new_stored = 0;  // lz4 payload + record header of each new distinct chunk
};

uint64_t StoredBytes(Bytes chunk, Buffer* scratch) {
  Compress(CodecSpec{Codec::kLz4, 0}, chunk, scratch);
  return scratch->size() + kRecordHeaderBytes;
}

// What storing `next` adds to a store that holds `known` (distinct chunk ids of the base).
Dedup Added(Bytes next, const std::vector<Span>& spans, std::unordered_set<ChunkId> known) {
  Dedup d;
  Buffer scratch;
  for (const Span& s : spans) {
    Bytes c = next.subspan(s.offset, s.length);
    if (!known.insert(ChunkId::Of(c)).second) continue;
    ++d.new_chunks;
    d.new_raw += c.size();
    d.new_stored += StoredBytes(c, &scratch);
  }
  return d;
}

// Blocks of `block` bytes where a and b differ, and how many runs of such blocks there are.
std::pair<uint64_t, uint64_t> ChangedBlocks(Bytes a, Bytes b, size_t block) {
  uint64_t changed = 0, runs = 0;
  bool prev = false;
  for (size_t off = 0; off < a.size(); off += block) {
    size_t len = std::min(block, a.size() - off);
    bool diff = off + len > b.size() || std::memcmp(a.data() + off, b.data() + off, len) != 0;
    changed += diff;
    runs += diff && !prev;
    prev = diff;
  }
  return {changed, runs};
}

// LMDB bytes one version takes: the catalog file of a fresh catalog holding just this content
// (its chunk rows and chunk references, as CommitContent writes them), less an empty one's.
uint64_t CatalogBytes(const fs::path& dir, const std::vector<ChunkRef>& refs) {
  fs::remove_all(dir);
  uint64_t empty = 0;
  {
    auto catalog = Unwrap(Catalog::Open(dir), "open catalog");
    empty = fs::file_size(dir / "data.mdb");
    auto txn = Unwrap(catalog->BeginWrite(), "begin");
    uint64_t size = 0;
    for (const ChunkRef& ref : refs) {
      ChunkRow row{1, ref.offset, ref.length + 64, ref.length, Codec::kLz4, ref.offset, 1};
      Check(txn.PutChunkRef(1, ref), "put ref");
      Check(txn.PutChunk(ref.id, row), "put chunk");
      size += ref.length;
    }
    Check(txn.PutContent(1, ContentRow{size, refs.size(), 0}), "put content");
    Check(txn.Commit(), "commit");
  }
  uint64_t full = fs::file_size(dir / "data.mdb");
  fs::remove_all(dir);
  return full - empty;
}

// Expected bytes decoded per uncached random read of `read` bytes, over the bytes returned.
double ReadAmplification(const std::vector<Span>& spans, uint64_t size, size_t read) {
  double decoded = 0;
  for (const Span& s : spans) {
    decoded += static_cast<double>(s.length) * static_cast<double>(s.length + read - 1) / size;
  }
  return decoded / static_cast<double>(read);
}

struct StoreCost {
  std::vector<double> ingest, seq_read, random_read;
};

// Ingests v1 into fresh stores with these chunk sizes, then reads it back with the page cache
// warm: sequentially in 4 MiB pieces (after one untimed pass, so that the decoded-chunk cache's
// memory is recycled rather than freshly faulted in), and with random 128 KiB reads (what FUSE
// sends) with the decoded-chunk cache off, so that every read decodes the chunks it touches.
StoreCost MeasureStore(const fs::path& dir, Bytes v1, const FastCdc::Params& p, int runs) {
  constexpr size_t kRandomRead = 128 << 10;
  constexpr int kRandomReads = 64;
  StoreOptions options = BenchOptions();
  options.chunking = p;
  StoreCost cost;
  ContentId id = 0;
  for (int r = 0; r < runs; ++r) {
    fs::remove_all(dir);
    ::sync();
    auto store = Unwrap(Store::Open(dir, options), "open store");
    cost.ingest.push_back(v1.size() / 1e9 / Ingest(store.get(), v1, &id).wall);
  }
  Buffer out(v1.size());
  std::memset(out.data(), 0, out.size());
  {
    auto store = Unwrap(Store::Open(dir, options), "open store");
    (void)StoreRead(*store, id, out.mutable_bytes());
    for (int r = 0; r < runs; ++r) {
      cost.seq_read.push_back(v1.size() / 1e9 / StoreRead(*store, id, out.mutable_bytes()).wall);
    }
    if (std::memcmp(out.data(), v1.data(), v1.size()) != 0) Die("store read wrong bytes");
  }
  std::vector<uint64_t> offsets;
  uint64_t x = 42;  // a fixed LCG: the same offsets for every setting
  for (int i = 0; i < kRandomReads; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    offsets.push_back(((x >> 11) % (v1.size() - kRandomRead)) & ~uint64_t{4095});
  }
  options.cache_bytes = 0;
  auto store = Unwrap(Store::Open(dir, options), "open store");
  for (int r = 0; r < runs; ++r) {
    double secs = Seconds([&] {
      for (uint64_t off : offsets) {
        Unwrap(store->Read(id, off, out.mutable_bytes().subspan(0, kRandomRead)), "read");
      }
    });
    cost.random_read.push_back(kRandomReads * kRandomRead / 1e6 / secs);
  }
  store.reset();
  fs::remove_all(dir);
  return cost;
}

void RunChunkSizes(Bytes v1, const Buffer* v2, const fs::path& dir, int runs,
                   const E2eResult& e2e) {
  const uint64_t n = v1.size();
  constexpr size_t kInsertAt = 1000;
  constexpr char kInserted[] = "ckptfs!";  // 7 bytes, inside the pickle near the start
  Buffer ins(n + sizeof(kInserted) - 1);
  std::memcpy(ins.data(), v1.data(), kInsertAt);
  std::memcpy(ins.data() + kInsertAt, kInserted, sizeof(kInserted) - 1);
  std::memcpy(ins.data() + kInsertAt + sizeof(kInserted) - 1, v1.data() + kInsertAt, n - kInsertAt);

  TextTable dedup({"setting min/avg/max", "chunks", "mean", "LMDB/version", "v1 stored",
                   "v2 adds (frozen half)", "v1+7 B at 1000 adds"});
  TextTable cost({"setting min/avg/max", "FastCDC GB/s", "range", "ingest GB/s", "range",
                  "seq read GB/s", "range", "rand 128K MB/s", "range", "read ampl."});
  std::vector<size_t> avgs = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
  uint64_t default_v2_stored = 0;
  for (int i = 0; i <= static_cast<int>(avgs.size()); ++i) {
    const bool fixed = i == static_cast<int>(avgs.size());
    const size_t avg = fixed ? (1 << 20) : avgs[i];
    const FastCdc::Params p = ParamsFor(avg);
    const std::string name = fixed
                                 ? "fixed 1M blocks (no CDC)"
                                 : Fmt("%s/%s/%s", SizeName(p.min_size).c_str(),
                                       SizeName(p.avg_size).c_str(), SizeName(p.max_size).c_str());
    std::fprintf(stderr, "engine_bench: chunk sizes %s\n", name.c_str());
    std::vector<double> secs;
    std::vector<Span> s1;
    if (!fixed) {
      for (int r = 0; r < runs; ++r) secs.push_back(Seconds([&] { s1 = CutAll(v1, p); }));
    } else {
      s1 = CutFixed(n, avg);
    }
    std::unordered_set<ChunkId> known;
    std::vector<ChunkRef> refs;
    uint64_t v1_stored = 0;
    Buffer scratch;
    for (const Span& s : s1) {
      Bytes c = v1.subspan(s.offset, s.length);
      ChunkId id = ChunkId::Of(c);
      refs.push_back(ChunkRef{s.offset, id, static_cast<uint32_t>(s.length)});
      if (known.insert(id).second) v1_stored += StoredBytes(c, &scratch);
    }
    auto describe = [&](const Dedup& d) {
      return Fmt("%.1f MB (%.1f%%), %llu ch", d.new_stored / 1e6, 100.0 * d.new_stored / v1_stored,
                 static_cast<unsigned long long>(d.new_chunks));
    };
    std::string v2_cell = "-";
    if (v2 != nullptr) {
      std::vector<Span> s2 = fixed ? CutFixed(v2->size(), avg) : CutAll(v2->bytes(), p);
      Dedup d = Added(v2->bytes(), s2, known);
      v2_cell = describe(d);
      if (!fixed && avg == FastCdc::Params{}.avg_size) default_v2_stored = d.new_stored;
    }
    std::vector<Span> si = fixed ? CutFixed(ins.size(), avg) : CutAll(ins.bytes(), p);
    std::string ins_cell = describe(Added(ins.bytes(), si, known));
    uint64_t lmdb = CatalogBytes(dir / "catalog", refs);
    dedup.Add({name, Fmt("%zu", s1.size()), Fmt("%.0f KiB", n / 1024.0 / s1.size()),
               Fmt("%.2f MB (%.0f B/ch)", lmdb / 1e6, static_cast<double>(lmdb) / s1.size()),
               Fmt("%.1f MB", v1_stored / 1e6), v2_cell, ins_cell});
    if (!fixed) {
      StoreCost c = MeasureStore(dir / "store", v1, p, runs);
      auto rates = Rates(n, secs);
      cost.Add({name, Value(rates, ""), Range(rates), Value(c.ingest, ""), Range(c.ingest),
                Value(c.seq_read, ""), Range(c.seq_read), Value(c.random_read, "", 0),
                Range(c.random_read, 0), Fmt("%.1fx", ReadAmplification(s1, n, 128 << 10))});
    }
  }
  if (v2 != nullptr) {
    auto [changed, changed_runs] = ChangedBlocks(v1, v2->bytes(), 4096);
    dedup.Note(
        Fmt("v2 differs from v1 in %.1f MB at 4 KiB granularity (%.1f%%), in %llu separate "
            "runs: the floor for any chunking. torch.save writes tensors in string order "
            "of their keys (data/0, data/1, data/10, data/100, ...), which scatters the "
            "changed layers over the file",
            changed * 4096 / 1e6, 100.0 * changed * 4096 / n,
            static_cast<unsigned long long>(changed_runs)));
    if (e2e.have_v2) {
      dedup.Note(
          Fmt("check against the real store (default setting): ingesting v2 after v1 "
              "added %.1f MB of records; this model predicts %.1f MB",
              e2e.v2_added_record_bytes / 1e6, default_v2_stored / 1e6));
    }
  }
  dedup.Note(
      "'adds' = lz4 records (payload + 64 B header) of chunks not already stored, % of v1's "
      "stored bytes, and their count; LMDB/version = growth of data.mdb for one content's chunk "
      "rows and chunk references written in one transaction");
  dedup.Print(
      Fmt("chunk-size settings (min = avg/4, max = 4*avg): dedup and metadata, %.1f MB", n / 1e6));
  cost.Note(
      Fmt("FastCDC: one thread over v1. ingest: durable, fresh store, default options "
          "otherwise. seq read: Store::Read in 4 MiB pieces, page cache warm, after one "
          "untimed pass. rand: 64 Store::Reads of 128 KiB at random offsets, decoded-chunk "
          "cache off. Medians of %d.",
          runs));
  cost.Note("read ampl.: expected bytes decoded per uncached random 128 KiB read, over 128 KiB");
  cost.Print("chunk-size settings: costs");
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// 5. The piece codec on tensors (engine/codec/piece_codec.h), one thread: fp32 tensors of v1
// (and bf16 copies of them, rounded to nearest even) cut into the store's 1 MiB pieces, encoded
// on their own (a first version) and, with --v2, v2's pieces against v1's (a later version).

struct TensorPieces {
  Buffer bytes;                                 // the pieces back to back
  std::vector<Span> pieces;                     // into bytes
  std::vector<std::pair<Span, size_t>> deltas;  // a piece of `later` and its base piece index
  Buffer later;
};

ContentLayout ScanLayout(Bytes data) {
  LayoutScanner scanner;
  for (Bytes rest = data; !rest.empty();) rest = rest.subspan(scanner.Scan(rest));
  return scanner.TakeLayout();
}

// The fp32 sections of v1 (and of v2 where it has the same section at the same size), as fp32
// or converted to bf16; pieces of at most 1 MiB counted from each tensor's first byte.
TensorPieces CollectPieces(Bytes v1, const Buffer* v2, bool bf16) {
  ContentLayout l1 = ScanLayout(v1);
  ContentLayout l2 = v2 ? ScanLayout(v2->bytes()) : ContentLayout{};
  const uint8_t width = bf16 ? 2 : 4;
  constexpr size_t kPiece = 1u << 20;
  auto convert = [&](Bytes in, Buffer* out) {
    const size_t at = out->size();
    const size_t n = in.size() / 4;
    out->Resize(at + n * width);
    for (size_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, in.data() + 4 * i, 4);
      if (bf16) {
        const uint16_t h = static_cast<uint16_t>((v + 0x7fff + ((v >> 16) & 1)) >> 16);
        std::memcpy(out->data() + at + 2 * i, &h, 2);
      } else {
        std::memcpy(out->data() + at + 4 * i, &v, 4);
      }
    }
    return at;
  };
  TensorPieces tp;
  // Room for every tensor up front: growing by each section's size copied all before it.
  tp.bytes.Reserve(v1.size() / 4 * width);
  if (v2 != nullptr) tp.later.Reserve(v2->size() / 4 * width);
  for (const LayoutSection& s : l1.sections) {
    if (s.dtype != DType::kF32 || s.size < 4) continue;
    const size_t at = convert(v1.subspan(s.start, s.size), &tp.bytes);
    const size_t len = s.size / 4 * width;
    const size_t first = tp.pieces.size();
    for (size_t o = 0; o < len; o += kPiece)
      tp.pieces.push_back({at + o, std::min(kPiece, len - o)});
    const LayoutSection* s2 = nullptr;
    for (const LayoutSection& c : l2.sections) {
      if (SectionKey(c.name) == SectionKey(s.name)) s2 = &c;
    }
    if (s2 == nullptr || s2->size != s.size) continue;
    const size_t at2 = convert(v2->bytes().subspan(s2->start, s2->size), &tp.later);
    for (size_t k = first; k < tp.pieces.size(); ++k) {
      const Span p2{at2 + (tp.pieces[k].offset - at), tp.pieces[k].length};
      // An unchanged piece is deduplicated by the store and never reaches the codec.
      if (std::memcmp(tp.later.data() + p2.offset, tp.bytes.data() + tp.pieces[k].offset,
                      p2.length) == 0) {
        continue;
      }
      tp.deltas.push_back({p2, k});
    }
  }
  return tp;
}

// Seconds of this thread's CPU time that fn takes: per-core speed, which on a shared machine
// wall time overstates by however long the thread waited for a core.
double ThreadCpuSeconds(const std::function<void()>& fn) {
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  };
  const double t0 = now();
  fn();
  return now() - t0;
}

void RunCodecs(Bytes v1, const Buffer* v2, int runs, const std::vector<std::string>& specs,
               TextTable* t) {
  auto measure = [&](const std::function<void()>& fn) {
    fn();
    std::vector<double> secs;
    for (int i = 0; i < runs; ++i) secs.push_back(ThreadCpuSeconds(fn));
    return secs;
  };
  for (bool bf16 : {false, true}) {
    TensorPieces tp = CollectPieces(v1, v2, bf16);
    const uint8_t width = bf16 ? 2 : 4;
    const char* dt = bf16 ? "bf16" : "fp32";
    std::vector<Buffer> bases(tp.pieces.size());
    for (size_t k = 0; k < tp.pieces.size(); ++k) {
      bases[k] = Buffer(tp.bytes.bytes().subspan(tp.pieces[k].offset, tp.pieces[k].length));
    }
    t->Section(
        Fmt("piece codec, one thread, GB/s of raw bytes per CPU-second of the thread: %s tensors "
            "of v1 (%.1f MB, %zu pieces of <= 1 MiB)%s",
            dt, tp.bytes.size() / 1e6, tp.pieces.size(),
            tp.deltas.empty()
                ? ""
                : Fmt("; later: v2's %zu changed pieces against v1's", tp.deltas.size()).c_str()));
    for (const std::string& spec_name : specs) {
      const char* name = spec_name.c_str();
      const CodecSpec spec = Unwrap(CodecSpec::Parse(name), "codec");
      for (bool later : {false, true}) {
        if (later && tp.deltas.empty()) continue;
        const size_t count = later ? tp.deltas.size() : tp.pieces.size();
        const Buffer& src = later ? tp.later : tp.bytes;
        auto piece = [&](size_t k) { return later ? tp.deltas[k].first : tp.pieces[k]; };
        auto base = [&](size_t k) { return later ? &bases[tp.deltas[k].second] : nullptr; };
        std::vector<EncodedPiece> enc(count);
        uint64_t raw = 0;
        for (size_t k = 0; k < count; ++k) raw += piece(k).length;
        Buffer dst(raw);
        std::memset(dst.data(), 0, raw);
        auto encode = [&](size_t k) {
          const Span p = piece(k);
          return EncodePiece(spec, src.bytes().subspan(p.offset, p.length), width, base(k));
        };
        // Timed as the store runs it: each piece's output is dropped (written) before the next,
        // so the allocator recycles its memory instead of faulting in fresh pages.
        auto ce = measure([&] {
          for (size_t k = 0; k < count; ++k) g_sink = g_sink + encode(k).stored.size();
        });
        for (size_t k = 0; k < count; ++k) enc[k] = encode(k);
        auto cd = measure([&] {
          size_t at = 0;
          for (size_t k = 0; k < count; ++k) {
            const Span p = piece(k);
            const Buffer* b = base(k);
            Check(DecodePiece(enc[k].encoding,
                              enc[k].stored_raw() ? src.bytes().subspan(p.offset, p.length)
                                                  : enc[k].stored.bytes(),
                              b ? b->bytes() : Bytes{}, dst.mutable_bytes().subspan(at, p.length)),
                  "decode piece");
            at += p.length;
          }
        });
        uint64_t stored = 0;
        size_t at = 0;
        for (size_t k = 0; k < count; ++k) {
          const Span p = piece(k);
          stored += enc[k].stored_raw() ? p.length : enc[k].stored.size();
          if (std::memcmp(dst.data() + at, src.data() + p.offset, p.length) != 0) {
            Die(Fmt("%s %s piece %zu does not round-trip", name, dt, k));
          }
          at += p.length;
        }
        const bool is_default = std::string(name) == "auto";
        auto er = Rates(raw, ce), dr = Rates(raw, cd);
        const std::string ratio = Fmt("%.3f of raw", static_cast<double>(stored) / raw);
        const char* which = later ? "later (delta)" : "first";
        t->Add({Fmt("%s %s %s encode", name, dt, which), Value(er, "GB/s"), Range(er), ratio,
                is_default ? Fmt(">= 1 GB/s: %s", Median(er) >= 1.0 ? "met" : "MISSED") : ""});
        t->Add({Fmt("%s %s %s decode", name, dt, which), Value(dr, "GB/s"), Range(dr), "",
                is_default ? Fmt(">= 1.5 GB/s: %s", Median(dr) >= 1.5 ? "met" : "MISSED") : ""});
      }
    }
  }
}
}  // namespace ckptfs

int main(int argc, char** argv) {
  using namespace ckptfs;
  std::string v1_path, v2_path, dir, only = "micro,e2e,hash,codec,chunk";
  std::vector<std::string> codecs = {"auto", "lz4", "zstd:1", "zstd:3", "auto+zstd:1"};
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--v1") {
      v1_path = next();
    } else if (a == "--v2") {
      v2_path = next();
    } else if (a == "--dir") {
      dir = next();
    } else if (a == "--runs") {
      runs = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--only") {
      only = next();
    } else if (a == "--codecs") {
      codecs.clear();
      std::string list = next();
      for (size_t at = 0; at <= list.size();) {
        size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) codecs.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a == "--no-format-aware") {
      g_format_aware = false;
    } else if (a == "--vector-level") {
      const std::string level = next();
      if (level == "avx512") {
        CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx512);
      } else if (level == "avx2") {
        CapCodecVectorLevelForTesting(CodecVectorLevel::kAvx2);
      } else if (level == "baseline") {
        CapCodecVectorLevelForTesting(CodecVectorLevel::kBaseline);
      } else {
        Die("--vector-level: avx512, avx2 or baseline");
      }
    } else {
      Die("usage: engine_bench --v1 FILE --dir DIR [--v2 FILE] [--runs N] "
          "[--only micro,e2e,hash,codec,chunk] [--codecs auto,lz4,...] [--no-format-aware] "
          "[--vector-level avx512|avx2|baseline]");
    }
  }
  if (v1_path.empty() || dir.empty()) Die("--v1 and --dir are required");
  auto want = [&](const char* what) { return only.find(what) != std::string::npos; };
  spdlog::set_level(spdlog::level::warn);
  fs::create_directories(dir);

  Buffer v1 = ReadWholeFile(v1_path);
  std::unique_ptr<Buffer> v2;
  if (!v2_path.empty()) v2 = std::make_unique<Buffer>(ReadWholeFile(v2_path));
  static const char* const kLevels[] = {"baseline", "AVX2", "AVX-512"};
  std::printf(
      "engine_bench: v1 %s (%.1f MB)%s, %d runs per measurement, %u CPUs (%s), codec loops "
      "at %s\n",
      v1_path.c_str(), v1.size() / 1e6,
      v2 ? Fmt(", v2 %s (%.1f MB)", v2_path.c_str(), v2->size() / 1e6).c_str() : "", runs,
      std::thread::hardware_concurrency(), CpuName().c_str(),
      kLevels[static_cast<int>(CodecVectorLevelInUse())]);

  TextTable main_table({"measurement", "median", "range", "vs peer / ratio", "target"});
  if (want("micro")) RunMicro(v1.bytes(), runs, &main_table);
  E2eResult e2e;
  if (want("e2e")) e2e = RunE2e(v1.bytes(), v2.get(), dir, runs, &main_table);
  if (want("hash")) RunHashes(v1.bytes(), v1_path, runs, &main_table);
  if (want("codec")) RunCodecs(v1.bytes(), v2.get(), runs, codecs, &main_table);
  main_table.Print("engine throughput (GB/s = 1e9 B/s; median of runs, [min .. max])");
  if (want("chunk")) RunChunkSizes(v1.bytes(), v2.get(), dir, runs, e2e);
  return 0;
}
