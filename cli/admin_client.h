// cli/admin_client.h
//
// Runs an admin request (engine/namespace/admin.h) against a STORE|MNT target: through the
// daemon's control socket when the store is mounted, else on the store opened here (with its
// namespace when the request changes it). Both answer the same JSON.
#pragma once

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "engine/util/progress.h"

namespace ckptfs::cli {

// `progress` (when not empty) hears how far verify and gc are: from the daemon's progress
// frames (control_server.h) for a mounted store, from the store itself otherwise.
Result<nlohmann::json> RunAdminOn(const Target& target, nlohmann::json request,
                                  const ProgressFn& progress = {});

}  // namespace ckptfs::cli
