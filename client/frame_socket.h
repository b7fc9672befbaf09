// A connected unix stream socket that sends and receives protocol frames with timeouts.
// Thread contract: Send is thread-safe (writers are serialized); Receive must be called by one
// thread at a time; Shutdown may be called from any thread to wake a blocked Receive.
#ifndef CARPOOL_CLIENT_FRAME_SOCKET_H_
#define CARPOOL_CLIENT_FRAME_SOCKET_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "carpool/mutex.h"
#include "carpool/status.h"
#include "protocol/protocol.h"

namespace carpool {

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
  // server closed the connection, InvalidArgument/Corruption for a bad frame.
  Result<std::optional<protocol::Message>> Receive(std::chrono::milliseconds wait);
  // Receives one frame within `wait`, skipping heartbeats; an Error frame becomes its Status.
  Result<protocol::Message> Call(const protocol::Message& request, std::chrono::milliseconds wait);
  void Shutdown();

  const std::string& path() const { return path_; }

 private:
  FrameSocket(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status ReadExactly(uint8_t* data, size_t n);

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
