#include "protocol/segment_fd.h"

#include <errno.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>

namespace carpool::protocol {
namespace {

// Room for more descriptors than any frame carries, so that extra ones are seen, not truncated.
constexpr size_t kMaxFdsPerRead = 4;

}  // namespace

Status CheckFrameFds(MessageType type, size_t fds) {
  const size_t expected = CarriesFd(type) ? 1 : 0;
  if (fds == expected) return Status::OK();
  if (expected == 1) {
    return Status::Corruption(fmt::format(
        "the {} frame came without its {} segment (expected 1 file descriptor over the unix "
        "socket, got {}); is the peer a carpool server of this version, reached directly and not "
        "through a proxy that drops SCM_RIGHTS?",
        MessageTypeName(type), type == MessageType::kDecodeSegment ? "decode" : "batch", fds));
  }
  return Status::Corruption(fmt::format(
      "a {} frame came with {} file descriptors, which it never carries; is the peer a carpool "
      "server?",
      MessageTypeName(type), fds));
}

ssize_t SendWithFds(int socket, const void* data, size_t bytes, std::span<const int> fds) {
  iovec iov{const_cast<void*>(data), bytes};
  std::vector<char> control(CMSG_SPACE(fds.size_bytes()));  // new[] aligns it for cmsghdr
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size_bytes());
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size_bytes());
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t RecvWithFds(int socket, void* data, size_t bytes, std::vector<UniqueFd>& fds) {
  iovec iov{data, bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    errno = EBADMSG;
    return -1;
  }
  return n;
}

Result<std::unique_ptr<SharedMapping>> SharedMapping::Map(int fd, uint64_t bytes,
                                                          std::string_view what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Status::IOError(fmt::format("cannot stat {}: {}", what, std::strerror(errno)));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return Status::Corruption(
        fmt::format("{} is {} bytes, expected at least {}; the server and client disagree", what,
                    static_cast<int64_t>(st.st_size), bytes));
  }
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    return Status::IOError(
        fmt::format("cannot map {} ({} bytes): {}", what, bytes, std::strerror(errno)));
  }
  return std::unique_ptr<SharedMapping>(new SharedMapping(static_cast<uint8_t*>(at), bytes));
}

SharedMapping::~SharedMapping() { ::munmap(data_, bytes_); }

}  // namespace carpool::protocol
