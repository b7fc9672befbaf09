// The pieces of carpool_jpeg_decode_bench that the in-process probe (decode_probe.cc) shares:
// synthetic photo JPEGs, pinned copies of them, and one timed nvJPEG variant row. Bench code:
// not part of the server.
#ifndef CARPOOL_SERVER_GPU_JPEG_BENCH_ROWS_H_
#define CARPOOL_SERVER_GPU_JPEG_BENCH_ROWS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "carpool/status.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/jpeg_decoder.h"

namespace carpool::gpu {

// A w x h quality-90 4:2:0 JPEG of a gradient with noise, like the bench set's photos. ~5 ms.
std::vector<uint8_t> NoisyPhotoJpeg(int w, int h, uint32_t seed);

// The JPEGs copied into pinned memory, as the registered cache holds them; `held` views them.
Result<PinnedHostBuffer> Pin(const std::vector<std::vector<uint8_t>>& jpegs,
                             std::vector<std::span<const uint8_t>>* held);

double UnixSeconds();

// One decoder variant: "backend[+pools][+prealloc][+yuv|+nv12]", e.g. "hardware+pools+nv12".
struct Variant {
  std::string name;
  JpegDecoderOptions options;
  JpegOutput output = JpegOutput::kRgbInterleaved;
};
// InvalidArgument naming the text and the parts it may have.
Result<Variant> ParseVariant(const std::string& text);

// nvJPEG alone (no resize) in variant `v` for `seconds`, one batch at a time on a stream of its
// own: a row with its rate, the mean call per batch and its Unix start and end (to line it up
// with a training process beside it). The JPEGs are all w x h; InvalidArgument unless there is
// at least one batch of them and `seconds` is positive.
Result<std::string> VariantRow(const std::vector<std::vector<uint8_t>>& jpegs, int w, int h,
                               size_t batch, double seconds, const Variant& v);

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_JPEG_BENCH_ROWS_H_
