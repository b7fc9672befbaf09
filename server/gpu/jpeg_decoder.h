// JpegDecoder: batched JPEG decode on the GPU with nvJPEG, for GPU decode (issue 23, docs/gpu.md
// "GPU decode"). The hardware backend (the JPEG engines of A100, H100, H200: the SMs stay free
// for training) where the GPU has one, else the GPU-hybrid backend.
//
// libnvjpeg.so.13 is loaded at run time (dlopen), so a server built with GPU decode still starts
// where the library is missing; Create then says so and the CPU path serves. The header comes
// from PyPI's nvidia-nvjpeg wheel at build time (scripts/fetch_nvjpeg.sh); a build without it has
// CARPOOL_HAVE_NVJPEG undefined and Create returns Unavailable.
//
// Thread-compatible: one decoder per thread or under its owner's lock. Every handle is RAII.
#ifndef CARPOOL_SERVER_GPU_JPEG_DECODER_H_
#define CARPOOL_SERVER_GPU_JPEG_DECODER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "carpool/status.h"

namespace carpool::gpu {

enum class JpegBackend { kHardware, kGpuHybrid };
const char* JpegBackendName(JpegBackend backend);

// How nvJPEG runs: the backend to prefer, its memory pools, and a pre-allocation of its
// internal buffers for batches of images of about this size (0: none; the hardware backend only,
// ignored where Create falls back to the GPU-hybrid one).
struct JpegDecoderOptions {
  JpegBackend prefer = JpegBackend::kHardware;
  bool memory_pools = false;  // NVJPEG_FLAGS_ENABLE_MEMORY_POOLS
  uint32_t preallocate_width = 0, preallocate_height = 0;
  // The engines read the JPEGs from device memory (NVJPEG_BACKEND_HARDWARE_DEVICE): DecodePlanes
  // uploads a batch's JPEGs itself, one copy per contiguous run of them, instead of nvJPEG's
  // copy per image. Where that backend is missing, Create takes the plain hardware one. Its
  // calls must all use one stream (or be synchronized in between): each reuses the upload buffer.
  // Measured slower, not faster (docs/benchmarks.md, "Issue 23, session 36"): off by default.
  bool device_input = false;
};

// What DecodePlanes writes: interleaved RGB in plane 0, planar Y/Cb/Cr at the stream's own
// chroma sub-sampling, or NV12 (Y in plane 0, interleaved CbCr at half height in plane 1).
enum class JpegOutput { kRgbInterleaved, kYuvPlanar, kNv12 };
const char* JpegOutputName(JpegOutput output);

// Up to three output planes on the device, each with its row pitch in bytes.
struct JpegPlanes {
  uint8_t* data[3] = {nullptr, nullptr, nullptr};
  uint32_t pitch[3] = {0, 0, 0};
};

// What the header says, and whether this decoder can take the stream; `why` names what it
// cannot (progressive, lossless, CMYK, a sub-sampling the engines lack, not a JPEG at all).
struct JpegFacts {
  bool supported = false;
  uint32_t width = 0, height = 0, components = 0;
  std::string why;
};

class JpegDecoder {
 public:
  // On the current CUDA device: up to `max_batch` images per DecodeBatch. Unavailable naming the
  // library (or the build) when nvJPEG cannot be used; `prefer` kGpuHybrid skips the engines.
  static Result<std::unique_ptr<JpegDecoder>> Create(uint32_t max_batch,
                                                     JpegBackend prefer = JpegBackend::kHardware);
  static Result<std::unique_ptr<JpegDecoder>> Create(uint32_t max_batch,
                                                     const JpegDecoderOptions& options);
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  JpegBackend backend() const { return backend_; }
  // True when the engines read the JPEGs from device memory (JpegDecoderOptions::device_input).
  bool device_input() const;
  uint32_t max_batch() const { return max_batch_; }
  // How often nvJPEG's batched state was (re)initialized: once per change of batch size.
  uint64_t initializations() const { return initializations_; }

  // Parses the header only. O(header bytes).
  JpegFacts Inspect(std::span<const uint8_t> encoded);
  // Decodes `encoded` (each Inspect-ed as supported; at most max_batch()) into interleaved RGB
  // on the device: out[i] holds width x height x 3 bytes with rows `pitch[i]` bytes apart.
  // Enqueued on `stream` (the caller synchronizes). InvalidArgument for a damaged stream, naming
  // nvJPEG's status; the batch is then all unusable, so callers retry its images one by one.
  Status DecodeBatch(std::span<const std::span<const uint8_t>> encoded,
                     std::span<uint8_t* const> out, std::span<const uint32_t> pitch,
                     cudaStream_t stream);
  // DecodeBatch's general form: `out[i]`'s planes in `format` (a change of format re-initializes
  // nvJPEG's batched state, as a change of batch size does).
  Status DecodePlanes(std::span<const std::span<const uint8_t>> encoded,
                      std::span<const JpegPlanes> out, JpegOutput format, cudaStream_t stream);

 private:
  struct Impl;
  explicit JpegDecoder(std::unique_ptr<Impl> impl, JpegBackend backend, uint32_t max_batch);
  std::unique_ptr<Impl> impl_;
  JpegBackend backend_;
  uint32_t max_batch_;
  uint64_t initializations_ = 0;
};

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_JPEG_DECODER_H_
