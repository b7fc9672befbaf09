// Reserves the pages of a new shared-memory object up front. tmpfs accepts any ftruncate and
// allocates on first touch, so without this a full /dev/shm shows up later as SIGBUS in whichever
// thread writes first, killing the server; with it, it is a clear error at creation. Thread-safe.
#ifndef CARPOOL_CACHE_SHM_RESERVE_H_
#define CARPOOL_CACHE_SHM_RESERVE_H_

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "carpool/status.h"

namespace carpool::cache {

// REQUIRES: fd is a shared-memory object already truncated to at least `bytes`.
inline Status ReserveShm(int fd, uint64_t bytes, std::string_view what, std::string_view advice) {
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err == 0) return Status::OK();
  struct statvfs fs {};
  uint64_t free_bytes = 0;
  if (::statvfs("/dev/shm", &fs) == 0) free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
  return Status::ResourceExhausted(fmt::format(
      "cannot reserve {} bytes of shared memory for {}: {} (/dev/shm has {} bytes free); {}",
      bytes, what, std::strerror(err), free_bytes, advice));
}

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_SHM_RESERVE_H_
