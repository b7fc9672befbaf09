// BatchDecoder: the decode=gpu samples of one GPU batch build, from their encoded JPEGs (host
// memory, ideally registered: the cache segment) to their prepared pixels in device memory.
// nvJPEG decodes them in batches (JpegDecoder); the exact resize kernel (resize_kernel.h) resizes
// and crops them into place. Streams nvJPEG refuses (Inspect), and images a decode batch fails
// on, are decoded on the CPU with the same pixels (PrepareGpuPixelsOnCpu) and copied up.
//
// Thread-compatible: one caller at a time (GpuService holds its lock). Every buffer is RAII.
#ifndef CARPOOL_SERVER_GPU_BATCH_DECODER_H_
#define CARPOOL_SERVER_GPU_BATCH_DECODER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "carpool/status.h"
#include "datasets/prepare_spec.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/jpeg_decoder.h"
#include "server/gpu/resize_kernel.h"
#include "server/prepare.h"

namespace carpool::gpu {

// One sample to decode: its JPEG, and where its prepared pixels (`shape`, packed) go.
struct DecodeTarget {
  size_t index = 0;  // the caller's, echoed in failures
  std::span<const uint8_t> encoded;
  PreparedShape shape;  // pixels() of the encoded view
  uint8_t* dst = nullptr;  // device memory of shape.bytes()
};

struct DecodeCounts {
  uint64_t gpu = 0, cpu = 0, bytes = 0, failed = 0;
  // Wall time by phase: nvJPEG's header parse (Inspect), the decode call, the resize launch,
  // the CPU side, and waiting for the stream.
  double inspect_s = 0, decode_s = 0, resize_s = 0, cpu_s = 0, wait_s = 0;
};

class BatchDecoder {
 public:
  // On the current device. `decoder` may be null: every target is then decoded on the CPU.
  // `scratch_bytes` caps the device memory holding decoded, not yet resized images.
  // `cpu_fallback` false: what nvJPEG refuses goes to `failed` instead of the CPU (a job's
  // process decoding for the server leaves those to the server).
  BatchDecoder(std::unique_ptr<JpegDecoder> decoder, uint64_t scratch_bytes,
               bool cpu_fallback = true);

  // nvJPEG's batched-state (re)initializations so far (one per change of batch size).
  uint64_t initializations() const { return decoder_ ? decoder_->initializations() : 0; }
  // "hardware", "gpu-hybrid", or "cpu" without an nvJPEG decoder.
  std::string backend() const;
  // True when nvJPEG reads the JPEGs from device memory (JpegDecoder::device_input).
  bool device_input() const { return decoder_ && decoder_->device_input(); }

  // Decodes every target into its dst, enqueued on `stream`: work the caller enqueues after it
  // on the stream sees the pixels (it returns after the stream has finished only when the CPU
  // decoded some, whose host buffers must outlive their copies). Targets neither nvJPEG
  // nor the CPU decodes, or whose decoded size disagrees with shape, go to `failed` with why;
  // the others are done. A CUDA error fails the whole call.
  // Cost: the CPU parse of each header, the decode (~30-40 us an image on the JPEG engines), one
  // resize kernel per decode batch.
  Status Decode(const PrepareSpec& spec, std::span<const DecodeTarget> targets,
                cudaStream_t stream, std::vector<std::pair<size_t, Status>>* failed,
                DecodeCounts* counts);

 private:
  // nvJPEG on targets[first, first + count) (all Inspect-ed as supported), then the resize.
  // Images of a batch that fails are retried one by one; those failing alone go to `cpu`.
  Status DecodeOnGpu(const PrepareSpec& spec, std::span<const DecodeTarget* const> batch,
                     std::span<const JpegFacts> facts, cudaStream_t stream,
                     std::vector<const DecodeTarget*>* cpu, DecodeCounts* counts);
  Status Resize(std::span<const ResizeImage> images, cudaStream_t stream);
  Status EnsureScratch(uint64_t bytes);

  std::unique_ptr<JpegDecoder> decoder_;
  uint64_t scratch_cap_;
  bool cpu_fallback_;
  DeviceBuffer scratch_;         // decoded RGB images of one decode batch
  DeviceBuffer descriptors_;     // ResizeImage table of one resize launch
  PinnedHostBuffer staging_;     // the same table, host side
};

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_BATCH_DECODER_H_
