// The server instance name, which names its cache segment ("carpool-<instance>" in /dev/shm) and
// its batch segments' memfds ("carpool-<instance>-job-<id>"). It derives from the socket path, so
// it is stable across restarts: a server restarted after a crash finds and replaces the cache
// segment the crashed one left in /dev/shm. Two servers on different sockets never collide.
// Thread-safe.
#ifndef CARPOOL_SERVER_INSTANCE_NAME_H_
#define CARPOOL_SERVER_INSTANCE_NAME_H_

#include <fmt/core.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace carpool {

inline std::string InstanceNameForSocket(const std::string& socket_path) {
  std::error_code ec;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(socket_path, ec);
  const std::string key = ec ? socket_path : canonical.string();
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 48 bits kept
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return fmt::format("s{:012x}", h & 0xffffffffffffull);
}

}  // namespace carpool

#endif  // CARPOOL_SERVER_INSTANCE_NAME_H_
