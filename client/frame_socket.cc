#include "client/frame_socket.h"

#include <errno.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "protocol/segment_fd.h"

namespace carpool {
namespace {

Status Unavailable(const std::string& path, const std::string& what) {
  return Status::Unavailable(fmt::format(
      "carpool server at {} {}; check that 'carpool server' is running there and reconnect", path,
      what));
}

}  // namespace

Status StatusFromError(const protocol::Error& error) {
  return Status(error.code, "server: " + error.message);
}

Result<std::unique_ptr<FrameSocket>> FrameSocket::Connect(const std::string& path,
                                                          std::chrono::milliseconds io_timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument(fmt::format(
        "socket path \"{}\" is empty or longer than {} bytes", path, sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(fmt::format("socket(): {}", std::strerror(errno)));
  std::unique_ptr<FrameSocket> s(new FrameSocket(fd, path));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EACCES) {
      return Status::Unavailable(fmt::format(
          "carpool server at {} is not open to this user ({}): a server admits only its own user, "
          "or also one group when started with --group; run the job as the server's user, or "
          "start the server with --group G for a group G of yours, and check that the socket's "
          "directories let you in",
          path, std::strerror(errno)));
    }
    return Unavailable(path, fmt::format("is not reachable ({})", std::strerror(errno)));
  }
  timeval tv{};
  tv.tv_sec = io_timeout.count() / 1000;
  tv.tv_usec = static_cast<suseconds_t>((io_timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return s;
}

FrameSocket::~FrameSocket() { ::close(fd_); }

void FrameSocket::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

Status FrameSocket::Send(const protocol::Message& message) {
  auto frame = protocol::EncodeFrame(message);
  if (!frame.ok()) return frame.status();
  MutexLock lock(send_mu_);
  size_t done = 0;
  while (done < frame->size()) {
    ssize_t n = ::send(fd_, frame->data() + done, frame->size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Unavailable(path_, "did not accept a frame in time (is it hung?)");
    }
    if (n <= 0) return Unavailable(path_, fmt::format("is gone ({})", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status FrameSocket::ReadExactly(uint8_t* data, size_t n, std::vector<UniqueFd>& fds) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = protocol::RecvWithFds(fd_, data + done, n - done, fds);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Unavailable(path_, "stopped in the middle of a frame (is it hung?)");
    }
    if (r == 0) return Unavailable(path_, "closed the connection");
    if (r < 0 && errno == EBADMSG) {
      return Status::Corruption(fmt::format(
          "carpool server at {} sent more file descriptors with a frame than any frame carries",
          path_));
    }
    if (r < 0) return Unavailable(path_, fmt::format("is gone ({})", std::strerror(errno)));
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

Result<std::optional<ReceivedFrame>> FrameSocket::Receive(std::chrono::milliseconds wait) {
  pollfd p{fd_, POLLIN, 0};
  int ready = ::poll(&p, 1, static_cast<int>(wait.count()));
  if (ready < 0 && errno != EINTR) {
    return Status::IOError(fmt::format("poll(): {}", std::strerror(errno)));
  }
  if (ready <= 0) return std::optional<ReceivedFrame>();
  // The server attaches a descriptor to a frame's first byte, and each read stops at the frame's
  // end, so the descriptors read with a frame's bytes are that frame's.
  std::vector<UniqueFd> fds;
  uint8_t header_bytes[protocol::kFrameHeaderBytes];
  Status s = ReadExactly(header_bytes, sizeof(header_bytes), fds);
  if (!s.ok()) return s;
  auto header = protocol::DecodePeerFrameHeader(header_bytes);
  if (!header.ok()) return header.status();
  std::vector<uint8_t> payload(header->payload_bytes);
  s = ReadExactly(payload.data(), payload.size(), fds);
  if (!s.ok()) return s;
  if (header->version != protocol::kProtocolVersion) return ForeignFrame(*header, payload);
  if (Status carried = protocol::CheckFrameFds(header->type, fds.size()); !carried.ok()) {
    return Status::Corruption(fmt::format("carpool server at {}: {}", path_, carried.message()));
  }
  auto message = protocol::DecodePayload(header->type, payload);
  if (!message.ok()) return message.status();
  UniqueFd fd = fds.empty() ? UniqueFd() : std::move(fds.front());
  return std::optional<ReceivedFrame>(ReceivedFrame{std::move(*message), std::move(fd)});
}

Status FrameSocket::ForeignFrame(const protocol::FrameHeader& header,
                                 std::span<const uint8_t> payload) const {
  // A server of an older protocol (up to 5) rejects our hello with an error in its own version;
  // newer ones answer in ours, naming both versions themselves.
  std::string message = protocol::VersionMismatchMessage(
      protocol::DescribePeer(protocol::PackageVersion(), protocol::kProtocolVersion),
      protocol::DescribePeer("", header.version), path_);
  if (header.type == protocol::MessageType::kError) {
    auto e = protocol::DecodeForeignError(payload);
    if (e.ok()) message += fmt::format("; the server said: {}", e->message);
  }
  return Status::FailedPrecondition(std::move(message));
}

Result<ReceivedFrame> FrameSocket::Call(const protocol::Message& request,
                                        std::chrono::milliseconds wait) {
  Status s = Send(request);
  if (!s.ok()) return s;
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Unavailable(path_, fmt::format("sent no reply to {} within {} ms",
                                            protocol::MessageTypeName(protocol::TypeOf(request)),
                                            wait.count()));
    }
    auto reply = Receive(left);
    if (!reply.ok()) return reply.status();
    if (!reply->has_value()) continue;
    protocol::Message& m = (*reply)->message;
    if (std::holds_alternative<protocol::Heartbeat>(m)) continue;
    if (auto* e = std::get_if<protocol::Error>(&m)) return StatusFromError(*e);
    return std::move(**reply);
  }
}

Result<Handshake> ConnectAndHello(const std::string& path, std::chrono::milliseconds timeout) {
  auto socket = FrameSocket::Connect(path, timeout);
  if (!socket.ok()) return socket.status();
  auto reply = (*socket)->Call(protocol::Hello{static_cast<uint32_t>(::getpid()), "carpool-cxx"},
                               timeout);
  if (!reply.ok()) return reply.status();
  auto* hello = std::get_if<protocol::HelloReply>(&reply->message);
  if (hello == nullptr) {
    return Status::Corruption(
        fmt::format("server at {} answered hello with {}", path,
                    protocol::MessageTypeName(protocol::TypeOf(reply->message))));
  }
  return Handshake{std::move(*socket), *hello};
}

}  // namespace carpool
