#include "engine/store/lmdb_check.h"

#include <fcntl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine/util/file.h"

namespace ckptfs {
namespace {

// LMDB 0.9's on-disk layout (mdb.c), 64-bit pgno_t and size_t.
constexpr uint32_t kMagic = 0xBEEFC0DE;
constexpr uint32_t kDataVersion = 1;
constexpr size_t kPageHeader = 16;  // pgno 8, pad 2, flags 2, lower 2, upper 2 (or pages 4)
constexpr size_t kNodeHeader = 8;   // lo 2, hi 2, flags 2, ksize 2
constexpr size_t kDbRecord = 48;    // MDB_db: pad 4, flags 2, depth 2, 5 x 8
constexpr size_t kMetaDbs = kPageHeader + 24;  // after magic 4, version 4, address 8, mapsize 8
constexpr size_t kMetaLastPage = kMetaDbs + 2 * kDbRecord;
constexpr size_t kMetaTxnId = kMetaLastPage + 8;
constexpr uint64_t kInvalidPage = ~uint64_t{0};
constexpr uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04, kMeta = 0x08;
constexpr uint16_t kPageKinds = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40;  // + LEAF2, SUBP
constexpr uint16_t kBigData = 0x01, kSubData = 0x02;
constexpr uint16_t kIntegerKey = 0x08;  // the free list's table flags
constexpr uint32_t kMaxDepth = 32;

uint16_t U16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t U32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t U64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

struct Db {
  uint16_t flags = 0;
  uint16_t depth = 0;
  uint64_t branch_pages = 0, leaf_pages = 0, overflow_pages = 0, entries = 0;
  uint64_t root = kInvalidPage;
};

Db ParseDb(const std::byte* p) {
  return Db{U16(p + 4),      U16(p + 6),      U64(p + 8), U64(p + 16),
            U64(p + 24),     U64(p + 32),     U64(p + 40)};
}

// LMDB's default key order (mdb_cmp_memn) or, for the free list, native integers.
int CompareKeys(std::string_view a, std::string_view b, bool integer) {
  if (integer) {
    uint64_t x = U64(reinterpret_cast<const std::byte*>(a.data()));
    uint64_t y = U64(reinterpret_cast<const std::byte*>(b.data()));
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return a.compare(b);
}

Status Damaged(const std::filesystem::path& path, const std::string& what) {
  return Status::Corruption("catalog " + path.string() + " is damaged (" + what +
                            "); nothing was read or written: restore the store's catalog "
                            "directory from a copy");
}

class Checker {
 public:
  Checker(int fd, std::filesystem::path path, size_t page_size, uint64_t last_page,
          uint64_t file_pages)
      : fd_(fd),
        path_(std::move(path)),
        page_size_(page_size),
        last_page_(last_page),
        file_pages_(file_pages),
        reached_(last_page + 1, false) {}

  // Walks one table's tree; `on_leaf` hears each leaf node's key, flags and data (inline, or
  // read from its overflow pages).
  template <typename OnLeaf>
  Status WalkTable(const std::string& name, const Db& db, bool integer_keys, OnLeaf on_leaf) {
    if (db.root == kInvalidPage) {
      if (db.depth != 0 || db.entries != 0 || db.branch_pages + db.leaf_pages != 0) {
        return Bad(name + ": an empty table with a depth or entries");
      }
      return Status::OK();
    }
    if (db.depth == 0 || db.depth > kMaxDepth) {
      return Bad(name + ": tree depth " + std::to_string(db.depth));
    }
    Counts counts;
    CKPTFS_RETURN_IF_ERROR(
        WalkPage(name, db, integer_keys, db.root, 1, std::nullopt, std::nullopt, &counts,
                 on_leaf));
    if (counts.branch != db.branch_pages || counts.leaf != db.leaf_pages ||
        counts.overflow != db.overflow_pages || counts.entries != db.entries) {
      return Bad(name + ": the table's record claims " + std::to_string(db.entries) +
                 " entries in " + std::to_string(db.branch_pages + db.leaf_pages) +
                 " pages, its tree holds " + std::to_string(counts.entries) + " in " +
                 std::to_string(counts.branch + counts.leaf));
    }
    return Status::OK();
  }

  // Marks a page reached (meta pages, free pages); Corruption when reached twice.
  Status Reach(uint64_t pgno, const std::string& what) {
    if (pgno > last_page_) {
      return Bad(what + ": page " + std::to_string(pgno) + " is past the last page " +
                 std::to_string(last_page_));
    }
    if (reached_[pgno]) return Bad(what + ": page " + std::to_string(pgno) + " used twice");
    reached_[pgno] = true;
    return Status::OK();
  }

  Status Bad(const std::string& what) const {
    return Damaged(path_, what);
  }

 private:
  struct Counts {
    uint64_t branch = 0, leaf = 0, overflow = 0, entries = 0;
  };

  Status ReadPage(uint64_t pgno, std::vector<std::byte>* page) {
    if (pgno >= file_pages_) {  // a tree's page was written: it lies inside the file
      return Bad("page " + std::to_string(pgno) + " is past the file's end (" +
                 std::to_string(file_pages_) + " pages)");
    }
    page->resize(page_size_);
    return PReadFull(fd_, pgno * page_size_, *page, path_);
  }

  template <typename OnLeaf>
  Status WalkPage(const std::string& name, const Db& db, bool integer_keys, uint64_t pgno,
                  uint32_t level, std::optional<std::string> low, std::optional<std::string> high,
                  Counts* counts, OnLeaf& on_leaf) {
    const std::string where = name + " page " + std::to_string(pgno);
    CKPTFS_RETURN_IF_ERROR(Reach(pgno, name));
    std::vector<std::byte> page;
    CKPTFS_RETURN_IF_ERROR(ReadPage(pgno, &page));
    const std::byte* p = page.data();
    if (U64(p) != pgno) return Bad(where + ": it names itself page " + std::to_string(U64(p)));
    const uint16_t kind = U16(p + 10) & kPageKinds;
    const bool leaf = level == db.depth;
    if (kind != (leaf ? kLeaf : kBranch)) {
      return Bad(where + ": flags " + std::to_string(U16(p + 10)) + " at tree level " +
                 std::to_string(level) + " of " + std::to_string(db.depth));
    }
    const size_t lower = U16(p + 12), upper = U16(p + 14);
    if (lower < kPageHeader || lower > upper || upper > page_size_ || (lower - kPageHeader) % 2) {
      return Bad(where + ": free space bounds " + std::to_string(lower) + ".." +
                 std::to_string(upper));
    }
    const size_t n = (lower - kPageHeader) / 2;
    if (n == 0) return Bad(where + ": no nodes");
    ++(leaf ? counts->leaf : counts->branch);
    std::optional<std::string> previous;
    std::vector<std::byte> overflow;
    for (size_t i = 0; i < n; ++i) {
      const size_t at = U16(p + kPageHeader + 2 * i);
      if (at < upper || at + kNodeHeader > page_size_) {
        return Bad(where + ": node " + std::to_string(i) + " at offset " + std::to_string(at));
      }
      const std::byte* node = p + at;
      const size_t ksize = U16(node + 6);
      if (at + kNodeHeader + ksize > page_size_) {
        return Bad(where + ": node " + std::to_string(i) + "'s key runs past the page");
      }
      std::string key(reinterpret_cast<const char*>(node + kNodeHeader), ksize);
      // A branch's first key is not stored (LMDB compares nothing against it).
      const bool compared = leaf || i > 0;
      if (compared) {
        if (integer_keys && ksize != 8) return Bad(where + ": an integer key of " + key);
        if ((previous && CompareKeys(*previous, key, integer_keys) >= 0) ||
            (low && CompareKeys(*low, key, integer_keys) > 0) ||
            (high && CompareKeys(key, *high, integer_keys) >= 0)) {
          return Bad(where + ": node " + std::to_string(i) + "'s key is out of order");
        }
        previous = key;
      }
      if (!leaf) {
        const uint64_t child = U16(node) | uint64_t{U16(node + 2)} << 16 |
                               uint64_t{U16(node + 4)} << 32;
        std::optional<std::string> child_low = i == 0 ? low : std::optional<std::string>(key);
        std::optional<std::string> child_high = high;
        if (i + 1 < n) {
          const size_t next = U16(p + kPageHeader + 2 * (i + 1));
          if (next < upper || next + kNodeHeader > page_size_ ||
              next + kNodeHeader + U16(p + next + 6) > page_size_) {
            return Bad(where + ": node " + std::to_string(i + 1) + " at offset " +
                       std::to_string(next));
          }
          child_high = std::string(reinterpret_cast<const char*>(p + next + kNodeHeader),
                                   U16(p + next + 6));
        }
        CKPTFS_RETURN_IF_ERROR(WalkPage(name, db, integer_keys, child, level + 1, child_low,
                                        child_high, counts, on_leaf));
        continue;
      }
      ++counts->entries;
      const uint16_t flags = U16(node + 4);
      const uint64_t dsize = U16(node) | uint64_t{U16(node + 2)} << 16;
      if (flags & ~(kBigData | kSubData)) {
        return Bad(where + ": node " + std::to_string(i) + " has flags " + std::to_string(flags));
      }
      const std::byte* data = node + kNodeHeader + ksize;
      if (!(flags & kBigData)) {
        if (at + kNodeHeader + ksize + dsize > page_size_) {
          return Bad(where + ": node " + std::to_string(i) + "'s value runs past the page");
        }
        CKPTFS_RETURN_IF_ERROR(on_leaf(key, flags, data, dsize));
        continue;
      }
      if (at + kNodeHeader + ksize + 8 > page_size_) {
        return Bad(where + ": node " + std::to_string(i) + "'s value runs past the page");
      }
      const uint64_t first = U64(data);
      const std::string owhere = where + " node " + std::to_string(i) + " overflow page " +
                                 std::to_string(first);
      if (first > last_page_) return Bad(owhere + ": past the last page");
      std::vector<std::byte> head;
      CKPTFS_RETURN_IF_ERROR(ReadPage(first, &head));
      const uint32_t pages = U32(head.data() + 12);
      if (U64(head.data()) != first || (U16(head.data() + 10) & kPageKinds) != kOverflow ||
          pages == 0 || first + pages - 1 > last_page_ || first + pages > file_pages_ ||
          dsize > uint64_t{pages} * page_size_ - kPageHeader) {
        return Bad(owhere + ": not an overflow run holding " + std::to_string(dsize) + " bytes");
      }
      for (uint64_t k = 0; k < pages; ++k) CKPTFS_RETURN_IF_ERROR(Reach(first + k, owhere));
      counts->overflow += pages;
      overflow.resize(dsize);
      CKPTFS_RETURN_IF_ERROR(PReadFull(fd_, first * page_size_ + kPageHeader, overflow, path_));
      CKPTFS_RETURN_IF_ERROR(on_leaf(key, flags, overflow.data(), dsize));
    }
    return Status::OK();
  }

  int fd_;
  std::filesystem::path path_;
  size_t page_size_;
  uint64_t last_page_;
  uint64_t file_pages_;  // pages the file holds
  std::vector<bool> reached_;  // one bit per page up to the last
};

}  // namespace

Status CheckLmdbFile(const std::filesystem::path& data_file) {
  std::error_code ec;
  if (!std::filesystem::exists(data_file, ec)) return Status::NotFound(data_file.string());
  CKPTFS_ASSIGN_OR_RETURN(FileDescriptor fd, OpenFile(data_file, O_RDONLY));
  CKPTFS_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), data_file));
  if (size == 0) return Status::OK();  // LMDB writes a new environment's meta pages

  auto bad = [&](const std::string& what) { return Damaged(data_file, what); };
  // Both meta pages must be meta pages (mdb_env_read_header); LMDB uses the newer one.
  std::vector<std::byte> meta[2];
  size_t page_size = 0;
  for (int i = 0; i < 2; ++i) {
    meta[i].resize(kMetaTxnId + 8);
    if (i == 1) {
      page_size = U32(meta[0].data() + kMetaDbs);  // the free list's md_pad: the page size
      if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1)) != 0) {
        return bad("page size " + std::to_string(page_size));
      }
    }
    if (i * page_size + meta[i].size() > size) return bad("a meta page past the file's end");
    CKPTFS_RETURN_IF_ERROR(PReadFull(fd.get(), i * page_size, meta[i], data_file));
    const std::byte* m = meta[i].data();
    if (U64(m) != static_cast<uint64_t>(i) || !(U16(m + 10) & kMeta) ||
        U32(m + kPageHeader) != kMagic || U32(m + kPageHeader + 4) != kDataVersion) {
      return bad("meta page " + std::to_string(i) + " header");
    }
  }
  const int newest = U64(meta[0].data() + kMetaTxnId) < U64(meta[1].data() + kMetaTxnId) ? 1 : 0;
  const std::byte* m = meta[newest].data();
  // The newest transaction's last page. It may lie past the file's end: LMDB does not write
  // the pages a transaction allocated and freed again ("loose" pages, which go to the free
  // list), and the file only grows by the pages written. It never lies past the map.
  const uint64_t last_page = U64(m + kMetaLastPage);
  const uint64_t map_size = U64(m + kPageHeader + 16);
  if (last_page < 1 || (map_size != 0 && last_page >= map_size / page_size)) {
    return bad("last page " + std::to_string(last_page) + " of a " + std::to_string(map_size) +
               "-byte map");
  }
  const Db free_db = ParseDb(m + kMetaDbs), main_db = ParseDb(m + kMetaDbs + kDbRecord);
  if (free_db.flags != kIntegerKey || main_db.flags != 0) {
    return bad("meta page " + std::to_string(newest) + " table flags");
  }

  Checker checker(fd.get(), data_file, page_size, last_page, size / page_size);
  CKPTFS_RETURN_IF_ERROR(checker.Reach(0, "meta"));
  CKPTFS_RETURN_IF_ERROR(checker.Reach(1, "meta"));
  // The main tree: one node per named table, each its table's record.
  std::vector<std::pair<std::string, Db>> tables;
  CKPTFS_RETURN_IF_ERROR(checker.WalkTable(
      "main table", main_db, false,
      [&](const std::string& key, uint16_t flags, const std::byte* data, uint64_t dsize) {
        if (flags != kSubData || dsize != kDbRecord) {
          return checker.Bad("main table entry " + key + " is not a table");
        }
        Db db = ParseDb(data);
        if (db.flags != 0) return checker.Bad("table " + key + " flags");
        tables.emplace_back(key, db);
        return Status::OK();
      }));
  for (const auto& [name, db] : tables) {
    CKPTFS_RETURN_IF_ERROR(checker.WalkTable(
        "table " + name, db, false,
        // An init-capture: clang 14 (scripts/thread_safety.sh) cannot capture a structured
        // binding.
        [&checker, &table = name](const std::string& key, uint16_t flags, const std::byte*,
                                  uint64_t) {
          return flags == kSubData ? checker.Bad("table " + table + " entry " + key + " flags")
                                   : Status::OK();
        }));
  }
  // The free list: txnid -> {count, pgno...}; a free page is never also in a tree.
  CKPTFS_RETURN_IF_ERROR(checker.WalkTable(
      "free list", free_db, true,
      [&](const std::string&, uint16_t flags, const std::byte* data, uint64_t dsize) {
        if (flags == kSubData || dsize < 8 || dsize % 8 != 0 || U64(data) != dsize / 8 - 1) {
          return checker.Bad("free list entry of " + std::to_string(dsize) + " bytes");
        }
        for (uint64_t k = 1; k < dsize / 8; ++k) {
          CKPTFS_RETURN_IF_ERROR(checker.Reach(U64(data + 8 * k), "free list"));
        }
        return Status::OK();
      }));
  return Status::OK();
}

}  // namespace ckptfs
