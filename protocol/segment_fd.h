// A job's batch segment travels as a memfd over the job's own socket (SCM_RIGHTS), as Wayland and
// PipeWire pass buffers: nothing in /dev/shm names it, so no other process can open it. The fd
// rides on the first byte of the job-info frame (CarriesFd); a decode job's decode segment, the
// JPEGs of its decode work, rides the same way on the decode-segment frame. Thread-safe: free
// functions over the OS; a SharedMapping is thread-compatible.
#ifndef CARPOOL_PROTOCOL_SEGMENT_FD_H_
#define CARPOOL_PROTOCOL_SEGMENT_FD_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"

namespace carpool::protocol {

// The frames that carry a file descriptor, exactly one each: a job-info carries its job's batch
// segment, a decode-segment the segment that the job's next decode works' JPEGs lie in; no other
// frame carries any.
inline constexpr bool CarriesFd(MessageType type) {
  return type == MessageType::kJobInfo || type == MessageType::kDecodeSegment;
}

// A frame of `type` arrived with `fds` descriptors: OK, or Corruption naming both.
Status CheckFrameFds(MessageType type, size_t fds);

// As send(2) with MSG_NOSIGNAL | MSG_DONTWAIT, with `fds` attached to the first byte sent (the
// server attaches one). -1 and errno on failure (EAGAIN: nothing was sent, the fds neither). The
// caller keeps its own descriptors.
ssize_t SendWithFds(int socket, const void* data, size_t bytes, std::span<const int> fds);

// As recv(2), and the descriptors that came with the bytes read appended to `fds` (close-on-exec).
// A stream socket drops the descriptors of bytes read by a plain recv(2), so a side that may be
// sent one reads every byte through this. More descriptors than it has room for: -1, EBADMSG.
ssize_t RecvWithFds(int socket, void* data, size_t bytes, std::vector<UniqueFd>& fds);

// A shared, read-write mapping of the first `bytes` of a segment fd; unmapped when it goes. The
// mapping outlives the fd.
class SharedMapping {
 public:
  // IOError naming `what` when the fd cannot be mapped; Corruption when it is smaller than `bytes`.
  static Result<std::unique_ptr<SharedMapping>> Map(int fd, uint64_t bytes, std::string_view what);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return bytes_; }

 private:
  SharedMapping(uint8_t* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  uint8_t* data_;
  uint64_t bytes_;
};

}  // namespace carpool::protocol

#endif  // CARPOOL_PROTOCOL_SEGMENT_FD_H_
