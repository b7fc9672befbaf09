// Who may connect to a server's unix socket: by default only the server's user (mode 0600); with
// `carpool server --group G` also the members of G (group G, mode 0660). Nothing else the server
// makes is opened by name: the cache is the server's alone and each job's batch segment goes to
// that job's process by fd. Thread-safe: free functions over the OS.
#ifndef CARPOOL_CACHE_CLIENT_ACCESS_H_
#define CARPOOL_CACHE_CLIENT_ACCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "carpool/status.h"

namespace carpool::cache {

struct ClientAccess {
  std::optional<gid_t> group;  // nullopt: the server's user only
  uint32_t mode() const { return group ? 0660u : 0600u; }
};

// The --group value: a group name, or else a numeric gid. InvalidArgument, naming the value and
// the groups this user is in, when there is no such group or this process may not give files to
// it (it is neither root nor a member).
Result<ClientAccess> ResolveClientGroup(std::string_view value);

// Gives the unix socket at `path` its access: the group first, while the mode still keeps everyone
// but the owner out, then the mode (by path: fchmod on a socket's fd leaves its file as it is).
// REQUIRES: nobody can connect yet (bound, not listening), so the order leaves no window.
Status ApplyClientAccess(const std::string& path, const ClientAccess& access);

// The outermost directory on the way to `path` that a member of `group` (not its owner) may not
// search, so that members cannot reach `path`; "" when there is none. From the mode bits only
// (ACLs are not read).
std::string FirstDirClosedToGroup(const std::string& path, gid_t group);

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_CLIENT_ACCESS_H_
