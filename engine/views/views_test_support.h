// engine/views/views_test_support.h
//
// Helpers for the tests of engine/views: files held in memory as a SourceReader, their layout
// as the store learns it, a virtual file read whole or in odd pieces, and the reference data
// of views_testdata.py (real torch, through Debian's /usr/bin/python3).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "engine/format/layout.h"
#include "engine/views/virtual_file.h"

namespace ckptfs::testing {

inline const std::string kViewsTestData =
    std::string(CKPTFS_SOURCE_DIR) + "/engine/views/views_testdata.py";

// Runs `views_testdata.py args`; returns its stdout, failing the test if it fails.
inline std::string RunTestData(const std::string& args) {
  const std::string command = "/usr/bin/python3 " + kViewsTestData + " " + args;
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return out;
  }
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << command << " failed (is python3-torch installed?)";
  return out;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void WriteWholeFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// A source over bytes in memory that counts what is read from it.
struct MemorySource {
  std::string data;
  uint64_t bytes_read = 0;
  SourceReader reader() {
    return [this](uint64_t offset, MutableBytes out) -> Result<size_t> {
      if (offset >= data.size()) return size_t{0};
      const size_t n = std::min<size_t>(out.size(), data.size() - offset);
      std::memcpy(out.data(), data.data() + offset, n);
      bytes_read += n;
      return n;
    };
  }
};

// The layout the store would keep for a file streamed in whole.
inline ContentLayout ScanLayout(std::string_view file) {
  LayoutScanner scanner;
  Bytes rest = AsBytes(file);
  while (!rest.empty()) rest = rest.subspan(scanner.Scan(rest));
  return scanner.TakeLayout();
}

// The whole virtual file, read in pieces of `piece` bytes.
inline std::string ReadAll(const VirtualFile& f, const SourceReader& source,
                           size_t piece = 1 << 20) {
  std::string out(f.size(), '\0');
  for (uint64_t at = 0; at < f.size();) {
    const size_t want = std::min<uint64_t>(piece, f.size() - at);
    auto n = f.Read(at, {reinterpret_cast<std::byte*>(out.data() + at), want}, source);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok() || *n == 0) {
      ADD_FAILURE() << "short read at " << at << " of " << f.size();
      out.resize(at);
      return out;
    }
    at += *n;
  }
  return out;
}

inline std::string Unhex(std::string_view hex) {
  std::string out;
  if (hex == "-") return out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

}  // namespace ckptfs::testing
