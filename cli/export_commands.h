// cli/export_commands.h
//
// Getting checkpoints out without a mount and without running pickle code: the bytes are read
// from the store (or through a mount), and tensors are found by engine/format's parsers and
// engine/views' per-tensor machinery (BuildTensorView), never by unpickling.
#pragma once

#include <string>

#include "cli/cli.h"

namespace ckptfs::cli {

// diff: per file and per tensor, unchanged/changed/added/removed; changed float tensors with
// the largest absolute difference and the fraction of elements that changed.
int Diff(const std::string& target, const std::string& v1, const std::string& v2, bool json);
// export SOURCE DEST: SOURCE is a checkpoint file inside a mount (MNT/VERSION/FILE) or
// STORE/VERSION/FILE of an unmounted store. to: "npy" (DEST a directory: one .npy per tensor
// and index.json) or "safetensors" (DEST a file). dtype: "" (as stored), fp32, bf16, fp16.
int Export(const std::string& source, const std::string& dest, const std::string& to,
           const std::string& dtype, bool json);
// restore STORE VERSION DIR: the version's files, bytes as stored, into DIR (a new directory).
int Restore(const std::string& target, const std::string& version, const std::string& dir,
            bool json);

}  // namespace ckptfs::cli
