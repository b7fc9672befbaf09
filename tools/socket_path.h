// Where the server listens: --socket, else <state-dir>/carpool.sock (docs/server.md, "flags").
// Shared by `carpool server`, `carpool consume` and `carpool status`. Thread-safe.
#ifndef CARPOOL_TOOLS_SOCKET_PATH_H_
#define CARPOOL_TOOLS_SOCKET_PATH_H_

#include <string>

#include "carpool/status.h"
#include "datasets/state_dir.h"

namespace carpool::tools {

inline constexpr const char* kSocketFileName = "carpool.sock";

inline Result<std::string> ResolveSocketPath(const std::string& socket_flag,
                                             const std::string& state_dir_flag) {
  if (!socket_flag.empty()) return socket_flag;
  Result<std::filesystem::path> dir = ResolveStateDir(state_dir_flag);
  if (!dir.ok()) return dir.status();
  return (*dir / kSocketFileName).string();
}

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_SOCKET_PATH_H_
