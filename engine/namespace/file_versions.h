// engine/namespace/file_versions.h
//
// File versions (docs/fs.md, "File versions"): frameworks that write every checkpoint as a new
// file in one directory (Lightning's `checkpoints/epoch=N-step=M.ckpt`, a
// `torch.save(f"ckpt_{step}.pt")` loop) get one version per file instead of one per top-level
// directory.
//
// A directory holds file versions when it, or a directory above it (the mount root included),
// carries the attribute `user.ckptfs.file_versions` = "1". Inside such a directory every
// regular file whose name ends in a checkpoint suffix (IsCheckpointFileName) is a file
// version: its inode has Inode::kFileVersion and a version sequence number from the counter
// that numbers directory versions, so both kinds sort in creation order. It is sealed on its
// own (Inode::kSealed on the file: writes, truncation, attribute changes fail with EROFS;
// unlink and rename stay allowed), explicitly or once a newer file version exists in the same
// directory and it has been idle (FileSystem's sealer). A top-level directory that holds file
// versions is a container, not a version: it is never sealed automatically.
//
// The flag is kept where names change (MakeNode, Rename) and where the marker is set or
// removed (MarkFileVersions), all inside the caller's catalog transaction.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/namespace/inode.h"
#include "engine/store/catalog.h"
#include "engine/util/status.h"

namespace ckptfs {

inline constexpr std::string_view kFileVersionsAttr = "user.ckptfs.file_versions";

// `.ckpt`, `.pt`, `.pth`, `.bin`, `.safetensors` (what torch.save, Lightning and
// safetensors write); other files in the directory (logs, hparams.yaml) are ordinary files.
bool IsCheckpointFileName(std::string_view name);

// Whether `dir` or a directory above it carries the marker.
Result<bool> HoldsFileVersions(const Catalog::ReadTxn& txn, Ino dir);

// Sets or clears Inode::kFileVersion on `file` (named `name`, in directory `dir`), taking a
// version sequence number the first time. A sealed file stays sealed either way. Writes the
// inode when it changed; returns whether the file is a file version now.
Result<bool> UpdateFileVersionFlag(Catalog::WriteTxn& txn, Inode& file, std::string_view name,
                                   Ino dir);

// Sets (on) or removes the marker of `dir` and updates the flag of every file below it.
Status MarkFileVersions(Catalog::WriteTxn& txn, Ino dir, bool on);
// Updates the flag of every file below `dir` (after `dir` moved).
Status RefreshFileVersions(Catalog::WriteTxn& txn, Ino dir);

struct FileVersionEntry {
  std::string path;  // from the mount root, e.g. "run/checkpoints/epoch=0-step=100.ckpt"
  Inode inode;
};
// Every file version in the namespace (each once), in no particular order.
Result<std::vector<FileVersionEntry>> ListFileVersions(const Catalog::ReadTxn& txn);

}  // namespace ckptfs
