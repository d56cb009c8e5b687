// fs/sd_notify.h
//
// Tells the service manager what the daemon is doing when it runs as a systemd service of
// Type=notify (packaging/systemd/ckptfs@.service): the datagram protocol of sd_notify(3), one
// message of newline-separated KEY=VALUE lines sent to the AF_UNIX socket named by
// $NOTIFY_SOCKET ("@name" is in the abstract namespace). Outside systemd ($NOTIFY_SOCKET unset)
// it does nothing.
//
//   NotifyServiceManager("READY=1\nSTATUS=serving /mnt/ckpt");   // once the mount is ready
//   NotifyServiceManager("STOPPING=1");                          // when shutting down
#pragma once

#include <string_view>

#include "engine/util/status.h"

namespace ckptfs {

// Returns OK when $NOTIFY_SOCKET is unset; an error when it is set but the message could not
// be sent (the caller logs it: a service manager that never hears READY=1 times the unit out).
Status NotifyServiceManager(std::string_view state);

}  // namespace ckptfs
