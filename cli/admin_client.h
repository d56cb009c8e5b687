// cli/admin_client.h
//
// Runs an admin request (engine/namespace/admin.h) against a STORE|MNT target: through the
// daemon's control socket when the store is mounted, else on the store opened here (with its
// namespace when the request changes it). Both answer the same JSON.
#pragma once

#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace ckptfs::cli {

Result<nlohmann::json> RunAdminOn(const Target& target, nlohmann::json request);

}  // namespace ckptfs::cli
