// JobDecoder: GPU decode in the job's own process. Beside a training process, nvJPEG in the server
// costs the trainer about 4x what the same decode costs inside the trainer's CUDA context, because
// the GPU time-slices between the two processes' contexts (docs/gpu.md, "Decoding in the jobs'
// processes"). So a GPU job's client may decode its builds' JPEGs itself: the server puts their
// bytes in a segment the client maps, the client decodes them into a device buffer it exports, and
// the server assembles from that buffer, the same kernel filling its resident area.
//
// The session implements it (it owns the socket); GpuService calls it. No CUDA type here.
#ifndef CARPOOL_SERVER_JOB_DECODE_H_
#define CARPOOL_SERVER_JOB_DECODE_H_

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"

namespace carpool {

// One JPEG to decode to height x width x channels uint8 pixels at dst_offset of the job's buffer.
struct JobDecodeItem {
  std::span<const uint8_t> encoded;
  uint32_t height = 0, width = 0, channels = 0;
  uint64_t dst_offset = 0;
};

// Where the decoded pixels are: the job's device buffer (a legacy CUDA IPC handle, the offset of
// its first byte from the base the handle names, its size), and the items it did not decode.
struct JobDecodeResult {
  std::string buffer_handle;
  uint64_t buffer_offset = 0, buffer_bytes = 0;
  std::vector<uint32_t> failed;  // indices into the items; the caller decodes them itself
  double copy_seconds = 0, wait_seconds = 0;  // putting the JPEGs in the segment; Await
};

// A work sent to the job and not answered yet (JobDecoder::Send).
struct JobDecodeTicket {
  uint64_t work_id = 0;
  uint32_t lane = 0;        // of the segment and of the job's buffer
  uint64_t lane_bytes = 0;  // of the job's buffer
  size_t items = 0;
  double copy_seconds = 0;  // putting the JPEGs in the segment
};

class JobDecoder {
 public:
  // Works a job may have outstanding: each has a lane of the decode segment and of the job's
  // buffer, so the next build's JPEGs are decoded while the previous build reads its pixels.
  static constexpr uint32_t kLanes = 2;

  virtual ~JobDecoder() = default;
  // False once the job has failed a decode or missed a deadline, or when it never offered to
  // decode: the caller then decodes itself. Any thread; O(1).
  virtual bool enabled() const = 0;
  // Turns it off for good, for `why` (logged): the caller could not use an answer. Any thread.
  virtual void Disable(const Status& why) = 0;
  // Copies the items' bytes into a free lane of the job's decode segment and sends the work: the
  // job decodes each item to dst_offset of a lane of `lane_bytes` in its buffer (the buffer holds
  // kLanes of them). FailedPrecondition, the decoder left on, while kLanes works are outstanding;
  // any other failure disables it for good. REQUIRES: one call at a time per job (GpuService
  // holds its GPU's lock). Cost: a memcpy of the JPEGs and a frame.
  virtual Result<JobDecodeTicket> Send(std::string_view prepare_spec,
                                       std::span<const JobDecodeItem> items,
                                       uint64_t lane_bytes) = 0;
  // Waits for the ticket's answer until `deadline`; its buffer_offset is its lane's. Any failure
  // (a CUDA error in the job, the job gone, the deadline, the decoder turned off meanwhile)
  // disables the decoder for good and returns the error: nothing of this work is then trusted.
  // Any thread; once per ticket. Cost: the job's decode (~20 ms for 256 images), and the works
  // queued before it.
  virtual Result<JobDecodeResult> Await(const JobDecodeTicket& ticket,
                                        std::chrono::milliseconds deadline) = 0;
  // Send, then Await.
  Result<JobDecodeResult> Decode(std::string_view prepare_spec,
                                 std::span<const JobDecodeItem> items, uint64_t lane_bytes,
                                 std::chrono::milliseconds deadline) {
    Result<JobDecodeTicket> ticket = Send(prepare_spec, items, lane_bytes);
    if (!ticket.ok()) return ticket.status();
    return Await(*ticket, deadline);
  }
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_JOB_DECODE_H_
