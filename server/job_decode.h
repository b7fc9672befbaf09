// JobDecoder: GPU decode in the job's own process. Beside a training process, nvJPEG in the server
// costs the trainer about 4x what the same decode costs inside the trainer's CUDA context, because
// the GPU time-slices between the two processes' contexts (docs/gpu.md, "Decoding in the jobs'
// processes"). So a GPU job's client may decode its builds' JPEGs itself: the server puts their
// bytes in a segment the client maps, the client decodes them into a device buffer it exports, and
// the server copies them into its resident area and assembles as before.
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
  double copy_seconds = 0, wait_seconds = 0;  // putting the JPEGs in the segment; the answer
};

class JobDecoder {
 public:
  virtual ~JobDecoder() = default;
  // False once the job has failed a decode or missed a deadline, or when it never offered to
  // decode: the caller then decodes itself. Any thread; O(1).
  virtual bool enabled() const = 0;
  // Copies the items' bytes into the job's decode segment, sends the work and waits for its
  // answer until `deadline`. Any failure (a CUDA error in the job, the job gone, the deadline)
  // disables the decoder for good and returns the error: nothing of this work is then trusted.
  // REQUIRES: one call at a time per job (GpuService serializes a GPU's builds).
  // Cost: a memcpy of the JPEGs, two frames, and the job's decode (~10-20 ms for 256 images).
  // Turns it off for good, for `why` (logged): the caller could not use an answer. Any thread.
  virtual void Disable(const Status& why) = 0;
  virtual Result<JobDecodeResult> Decode(std::string_view prepare_spec,
                                         std::span<const JobDecodeItem> items,
                                         uint64_t output_bytes,
                                         std::chrono::milliseconds deadline) = 0;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_JOB_DECODE_H_
