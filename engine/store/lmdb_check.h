// engine/store/lmdb_check.h
//
// A structural check of an LMDB data file (the catalog's data.mdb), run before LMDB maps it.
//
// LMDB trusts its pages: it keeps no checksums, and a flipped byte in a page header, a node
// pointer or a child page number makes mdb_cursor_get read outside the map (a segfault), or a
// flipped free-list entry makes the next write transaction reuse a live page (rows lost once
// the flip is undone). CheckLmdbFile walks what the newest meta page reaches, the way LMDB
// 0.9 lays it out (64-bit pgno_t), and refuses what LMDB could not read safely:
//   - meta: magic, version, page size, last page inside the file, roots and depths in range;
//   - every page of the main tree, of each named table and of the free list: its own page
//     number, its kind (branch above, leaf at the bottom, overflow where a node says so), node
//     pointers and nodes inside the page, keys in ascending order, each page reached once, the
//     counts of pages and entries the table's record claims;
//   - the free list: entries well formed, and no free page also reachable from a tree.
// Bytes inside keys and values are not checked here: the catalog's row decoders check them.
//
// Contract: OK means LMDB can open and read every table of the file without reading outside a
// page; Corruption names the page and what is wrong. NotFound when there is no file (a new
// catalog). Reads the file with pread, a page at a time; memory: two bits per page of the
// file plus one page per tree level. Must run while no other process writes the file (the
// store's LOCK is held).
#pragma once

#include <filesystem>

#include "engine/util/status.h"

namespace ckptfs {

Status CheckLmdbFile(const std::filesystem::path& data_file);

}  // namespace ckptfs
