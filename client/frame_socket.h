// A connected unix stream socket that sends and receives protocol frames with timeouts.
// Thread contract: Send is thread-safe (writers are serialized); Receive must be called by one
// thread at a time; Shutdown may be called from any thread to wake a blocked Receive.
#ifndef CARPOOL_CLIENT_FRAME_SOCKET_H_
#define CARPOOL_CLIENT_FRAME_SOCKET_H_

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "carpool/status.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"

namespace carpool {

// A frame and the descriptor that came with it: a job-info's batch segment (protocol/segment_fd.h).
struct ReceivedFrame {
  protocol::Message message;
  UniqueFd fd;  // valid exactly for a frame that carries one; Receive checks it
};

class FrameSocket {
 public:
  // kUnavailable when nothing listens at `path`, or this user may not connect to it (the server's
  // --group). `io_timeout` bounds every send and the reading of a frame once its first byte
  // arrived.
  static Result<std::unique_ptr<FrameSocket>> Connect(const std::string& path,
                                                      std::chrono::milliseconds io_timeout);
  ~FrameSocket();
  FrameSocket(const FrameSocket&) = delete;
  FrameSocket& operator=(const FrameSocket&) = delete;

  Status Send(const protocol::Message& message);
  // Waits up to `wait` for a frame to start; std::nullopt if none did. kUnavailable when the
  // server closed the connection, InvalidArgument/Corruption for a bad frame, and Corruption for
  // a job-info without its descriptor or any other frame with one.
  Result<std::optional<ReceivedFrame>> Receive(std::chrono::milliseconds wait);
  // Receives one frame within `wait`, skipping heartbeats; an Error frame becomes its Status.
  Result<ReceivedFrame> Call(const protocol::Message& request, std::chrono::milliseconds wait);
  void Shutdown();

  const std::string& path() const { return path_; }

 private:
  FrameSocket(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // The Status for a frame of another protocol version (a hello or an error): a version mismatch
  // naming both sides.
  Status ForeignFrame(const protocol::FrameHeader& header, std::span<const uint8_t> payload) const;
  // Reads n bytes; descriptors that came with them are appended to `fds`.
  Status ReadExactly(uint8_t* data, size_t n, std::vector<UniqueFd>& fds);

  int fd_;
  std::string path_;
  Mutex send_mu_;
};

// Connects, says hello and returns the socket with the server's hello reply.
struct Handshake {
  std::unique_ptr<FrameSocket> socket;
  protocol::HelloReply hello;
};
Result<Handshake> ConnectAndHello(const std::string& path, std::chrono::milliseconds timeout);

// The Status an Error frame carries, prefixed to say it came from the server.
Status StatusFromError(const protocol::Error& error);

}  // namespace carpool

#endif  // CARPOOL_CLIENT_FRAME_SOCKET_H_
