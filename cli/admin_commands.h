// cli/admin_commands.h
//
// Commands on a store that work whether it is mounted or not (STORE|MNT arguments, resolved
// by ResolveTarget in cli/cli.h): the daemon answers for a mounted store, the command opens an
// unmounted one; either way the answer is the same (engine/namespace/admin.h), printed in
// words or, with --json, as the JSON documented in docs/cli.md.
#pragma once

#include <string>

#include "cli/cli.h"

namespace ckptfs::cli {

int Verify(const std::string& target, bool json);
int Gc(const std::string& target, double rewrite_below, bool json);
int Stats(const std::string& target, bool json);
// log: the versions in creation order, or one version with its files.
int Log(const std::string& target, const std::string& version, bool json);
// forget: removes the sealed versions that neither the last `keep_last` nor (keep_every > 0)
// every keep_every-th version counted from the oldest keep, then runs gc. Versions not yet
// sealed are always kept. dry_run: say what would go, change nothing.
int Forget(const std::string& target, uint64_t keep_last, uint64_t keep_every, bool dry_run,
           bool json);
// advise: the checkpoint interval (Young, Daly; cli/advise.h) for the given MTBF and the save
// cost measured on `target`'s recent versions, or `save_seconds` when > 0 (target may then be
// empty). Exit 1 when nothing is measured yet, 2 for a malformed duration.
int Advise(const std::string& target, const std::string& mtbf, double save_seconds, bool json);
// status: the ckptfs mounts of this machine and their daemons.
int ShowStatus(bool json);

}  // namespace ckptfs::cli
