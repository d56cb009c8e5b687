// Tests of the pickle opcode table against CPython's (pickletools, through
// engine/format/pickle_ops_testdata.py run by /usr/bin/python3), and of PickleOpLength on real
// pickles of every protocol and on truncated ones.
#include "engine/format/pickle_ops.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ckptfs {
namespace {

const std::string kTestData =
    std::string(CKPTFS_SOURCE_DIR) + "/engine/format/pickle_ops_testdata.py";

std::vector<std::string> Lines(const std::string& command) {
  std::vector<std::string> lines;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return lines;
  std::string all;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) all.append(buf, n);
  if (pclose(p) != 0) return {};
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

TEST(PickleOps, TableMatchesCPython) {
  const std::vector<std::string> lines = Lines("/usr/bin/python3 " + kTestData + " table");
  ASSERT_GT(lines.size(), 60u) << "pickle_ops_testdata.py failed";
  std::set<int> known;
  for (const std::string& line : lines) {
    std::istringstream in(line);
    int code = 0, n = 0;
    std::string kind;
    in >> code >> kind >> n;
    known.insert(code);
    const PickleOpInfo info = PickleOpInfoOf(static_cast<uint8_t>(code));
    SCOPED_TRACE(line);
    EXPECT_NE(info.family, PickleFamily::kUnknown);
    const std::map<std::string, PickleArg::Kind> kinds = {{"none", PickleArg::kNone},
                                                          {"fixed", PickleArg::kFixed},
                                                          {"counted", PickleArg::kCounted},
                                                          {"lines", PickleArg::kLines}};
    ASSERT_TRUE(kinds.count(kind));
    EXPECT_EQ(info.arg.kind, kinds.at(kind));
    EXPECT_EQ(info.arg.n, n);
  }
  // Every other byte is no opcode.
  for (int b = 0; b < 256; ++b) {
    if (!known.count(b)) {
      EXPECT_EQ(PickleOpInfoOf(static_cast<uint8_t>(b)).family, PickleFamily::kUnknown) << b;
    }
  }
}

TEST(PickleOps, LengthsWalkRealPicklesToTheirStop) {
  const std::vector<std::string> lines = Lines("/usr/bin/python3 " + kTestData + " samples");
  ASSERT_GT(lines.size(), 100u) << "pickle_ops_testdata.py failed";
  for (const std::string& hex : lines) {
    const std::string pkl = FromHex(hex);
    SCOPED_TRACE(hex.substr(0, 80));
    size_t at = 0;
    bool stopped = false;
    while (at < pkl.size() && !stopped) {
      auto n = PickleOpLength(pkl, at);
      ASSERT_TRUE(n.ok()) << n.status().message() << " at " << at;
      stopped = static_cast<uint8_t>(pkl[at]) == pickle::kStop;
      at += *n;
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(at, pkl.size());
    // Cut anywhere inside an opcode's argument, the opcode is truncated, never overrun.
    for (size_t cut = 0; cut < pkl.size(); ++cut) {
      const std::string_view part(pkl.data(), cut);
      for (size_t p = 0; p < part.size();) {
        auto n = PickleOpLength(part, p);
        if (!n.ok()) break;
        ASSERT_LE(p + *n, part.size());
        p += *n;
      }
    }
  }
}

TEST(PickleOps, MalformedArguments) {
  EXPECT_FALSE(PickleOpLength("", 0).ok());
  EXPECT_FALSE(PickleOpLength("\xff", 0).ok());               // no opcode
  EXPECT_FALSE(PickleOpLength("X\x05\0\0\0ab", 0).ok());      // length past the end
  EXPECT_FALSE(PickleOpLength("T\xff\xff\xff\xff", 0).ok());  // negative BINSTRING length
  EXPECT_FALSE(PickleOpLength("cmodule\nname", 0).ok());      // second line unterminated
  EXPECT_EQ(*PickleOpLength("cmodule\nname\n.", 0), 13u);
  EXPECT_EQ(*PickleOpLength(std::string_view("\x8c\x02"
                                             "ab.",
                                             5),
                            0),
            4u);
  EXPECT_EQ(*PickleOpLength(std::string_view("\x95\1\0\0\0\0\0\0\0", 9), 0), 9u);
}

}  // namespace
}  // namespace ckptfs
