// Tests of ReadZipDirectory and ZipWriter: round trips (ZIP64 included, on a sparse virtual
// archive), archives Python's zipfile writes and reads, and malformed directories.
#include "engine/format/zip.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ckptfs {
namespace {

namespace fs = std::filesystem;

// An archive of `size` bytes made of byte strings at given offsets, zeros elsewhere.
struct SparseArchive {
  std::map<uint64_t, std::string> parts;
  uint64_t size = 0;

  ZipReadAt Reader() const {
    return [this](uint64_t offset, MutableBytes out) -> Result<size_t> {
      if (offset >= size) return size_t{0};
      const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), size - offset));
      std::memset(out.data(), 0, n);
      for (const auto& [at, bytes] : parts) {
        const uint64_t lo = std::max(at, offset), hi = std::min(at + bytes.size(), offset + n);
        if (lo < hi) std::memcpy(out.data() + (lo - offset), bytes.data() + (lo - at), hi - lo);
      }
      return n;
    };
  }
};

uint32_t Crc(const std::string& s) {
  return static_cast<uint32_t>(
      crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(s.data()), s.size()));
}

struct Entry {
  std::string name;
  std::string data;
};

std::string Build(const std::vector<Entry>& entries) {
  std::string out;
  ZipWriter w;
  for (const Entry& e : entries) {
    out += w.LocalHeader(e.name, e.data.size(), Crc(e.data), out.size());
    out += e.data;
  }
  out += w.Finish(out.size());
  return out;
}

ZipReadAt ReaderOf(const std::string& s) {
  return [&s](uint64_t offset, MutableBytes out) -> Result<size_t> {
    if (offset >= s.size()) return size_t{0};
    const size_t n = std::min<size_t>(out.size(), s.size() - offset);
    std::memcpy(out.data(), s.data() + offset, n);
    return n;
  };
}

TEST(Zip, RoundTrip) {
  const std::vector<Entry> entries = {{"archive/data.pkl", "pickle bytes"},
                                      {"archive/data/0", std::string(1000, 'x')},
                                      {"archive/data/1", ""},
                                      {"archive/version", "3\n"}};
  const std::string zip = Build(entries);
  auto dir = ReadZipDirectory(ReaderOf(zip), zip.size());
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  ASSERT_EQ(dir->size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipDirEntry& d = (*dir)[i];
    EXPECT_EQ(d.name, entries[i].name);
    EXPECT_EQ(d.size, entries[i].data.size());
    EXPECT_EQ(d.crc, Crc(entries[i].data));
    auto data = ReadZipDataOffset(ReaderOf(zip), d.local_offset);
    ASSERT_TRUE(data.ok());
    EXPECT_EQ(*data % 64, 0u) << "data aligned as torch aligns it";
    EXPECT_EQ(zip.substr(*data, d.size), entries[i].data);
  }
}

TEST(Zip, PythonZipfileReadsWhatWeWriteAndWeReadWhatItWrites) {
  const fs::path dir = fs::temp_directory_path() / ("ckptfs_zip_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string ours = Build({{"a/data.pkl", "abc"}, {"a/data/0", std::string(5000, 'y')}});
  std::ofstream(dir / "ours.zip", std::ios::binary) << ours;
  const std::string script =
      "import zipfile,sys\n"
      "z=zipfile.ZipFile(sys.argv[1]+'/ours.zip')\n"
      "assert z.testzip() is None\n"
      "assert z.namelist()==['a/data.pkl','a/data/0'], z.namelist()\n"
      "assert z.read('a/data/0')==b'y'*5000\n"
      "w=zipfile.ZipFile(sys.argv[1]+'/theirs.zip','w',zipfile.ZIP_STORED)\n"
      "w.writestr('t/data.pkl', b'p'*7)\n"
      "w.writestr('t/data/0', b'q'*70000)\n"
      "w.close()\n";
  std::ofstream(dir / "check.py") << script;
  ASSERT_EQ(
      std::system(("/usr/bin/python3 " + (dir / "check.py").string() + " " + dir.string()).c_str()),
      0);
  std::ifstream in(dir / "theirs.zip", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string theirs = ss.str();
  auto entries = ReadZipDirectory(ReaderOf(theirs), theirs.size());
  ASSERT_TRUE(entries.ok()) << entries.status().message();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[1].name, "t/data/0");
  auto at = ReadZipDataOffset(ReaderOf(theirs), (*entries)[1].local_offset);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(theirs.substr(*at, 70000), std::string(70000, 'q'));
  fs::remove_all(dir);
}

TEST(Zip, Zip64RoundTripOnASparseArchive) {
  // A 5 GiB entry, then a small one past 4 GiB: sizes and offsets need ZIP64 records.
  SparseArchive a;
  ZipWriter w;
  const uint64_t big = 5ull << 30;
  std::string h = w.LocalHeader("big", big, 0x12345678, 0);
  const uint64_t big_data = h.size();
  a.parts[0] = h;
  const uint64_t second = big_data + big;
  h = w.LocalHeader("small", 3, 0x9abcdef0, second);
  a.parts[second] = h;
  a.parts[second + h.size()] = "abc";
  const uint64_t end = second + h.size() + 3;
  const std::string tail = w.Finish(end);
  a.parts[end] = tail;
  a.size = end + tail.size();
  auto dir = ReadZipDirectory(a.Reader(), a.size);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  ASSERT_EQ(dir->size(), 2u);
  EXPECT_EQ((*dir)[0].size, big);
  EXPECT_EQ((*dir)[0].crc, 0x12345678u);
  EXPECT_EQ((*dir)[1].local_offset, second);
  EXPECT_EQ(*ReadZipDataOffset(a.Reader(), 0), big_data);
  EXPECT_EQ(*ReadZipDataOffset(a.Reader(), second), second + h.size());
}

TEST(Zip, MalformedDirectoriesAreErrorsNeverCrashes) {
  const std::string zip = Build({{"x/data.pkl", "abc"}, {"x/data/0", std::string(300, 'z')}});
  EXPECT_FALSE(ReadZipDirectory(ReaderOf(zip), 10).ok());  // no end record in reach
  std::string empty;
  EXPECT_FALSE(ReadZipDirectory(ReaderOf(empty), 0).ok());
  EXPECT_FALSE(ReadZipDataOffset(ReaderOf(zip), 5).ok());  // not a local header
  // A compressed entry is a valid ZIP feature torch does not write.
  std::string deflated = zip;
  const size_t cd = deflated.find("PK\1\2");
  ASSERT_NE(cd, std::string::npos);
  deflated[cd + 10] = 8;
  EXPECT_EQ(ReadZipDirectory(ReaderOf(deflated), deflated.size()).status().code(),
            Status::Code::kNotSupported);
  // Every single-byte change of the directory and end records: an error or entries that lie
  // inside the archive.
  std::mt19937 rng(7);
  for (size_t at = cd; at < zip.size(); ++at) {
    for (int k = 0; k < 4; ++k) {
      std::string bad = zip;
      bad[at] = static_cast<char>(rng());
      auto dir = ReadZipDirectory(ReaderOf(bad), bad.size());
      if (!dir.ok()) continue;
      for (const ZipDirEntry& e : *dir) {
        EXPECT_LE(e.local_offset, bad.size());
        EXPECT_LE(e.size, bad.size());
      }
    }
  }
}

}  // namespace
}  // namespace ckptfs
