// The resize of GPU decode (PrepareSpec::gpu_decode): an exact box filter in integer arithmetic,
// the same expression on the CPU (ExactResizeCrop) and in the GPU kernel
// (server/gpu/resize_kernel.cu), so both give the same bytes for the same decoded image.
//
// Output pixel x of a resized width RW over a source width SW covers the source interval
// [x*SW/RW, (x+1)*SW/RW); each source pixel counts by its overlap with it, exactly, in units of
// 1/RW (so the weights of one output pixel sum to SW). Rows likewise. The value is the weighted
// sum over SW*SH, rounded half up. Shrinking, that is area averaging (OpenCV's INTER_AREA computes
// the same in floating point); enlarging, it blends at most 2x2 source pixels.
// Header-only arithmetic with no dependencies: nvcc compiles it too.
#ifndef CARPOOL_SERVER_EXACT_RESIZE_H_
#define CARPOOL_SERVER_EXACT_RESIZE_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CARPOOL_HOST_DEVICE __host__ __device__
#else
#define CARPOOL_HOST_DEVICE
#endif

namespace carpool {

// Resize src_* to resized_*, then keep the out_* window at (crop_x, crop_y).
struct ResizeCropGeometry {
  int src_width = 0, src_height = 0;
  int resized_width = 0, resized_height = 0;
  int crop_x = 0, crop_y = 0;
  int out_width = 0, out_height = 0;
};

// Output pixel (ox, oy) of the window, `channels` (1..4) interleaved bytes, from `src` (rows
// `pitch` bytes apart). O(source pixels it covers x channels).
CARPOOL_HOST_DEVICE inline void ExactResizePixel(const ResizeCropGeometry& g, const uint8_t* src,
                                                 size_t pitch, int channels, int ox, int oy,
                                                 uint8_t* out) {
  const int64_t sw = g.src_width, sh = g.src_height, rw = g.resized_width, rh = g.resized_height;
  const int64_t x = ox + g.crop_x, y = oy + g.crop_y;
  const int64_t x_lo = x * sw, x_hi = (x + 1) * sw;  // in units of 1/rw of a source pixel
  const int64_t y_lo = y * sh, y_hi = (y + 1) * sh;
  uint64_t acc[4] = {0, 0, 0, 0};
  for (int64_t j = y_lo / rh; j * rh < y_hi; ++j) {
    const int64_t wy = (y_hi < (j + 1) * rh ? y_hi : (j + 1) * rh) - (y_lo > j * rh ? y_lo : j * rh);
    const uint8_t* row = src + static_cast<size_t>(j) * pitch;
    for (int64_t i = x_lo / rw; i * rw < x_hi; ++i) {
      const int64_t wx =
          (x_hi < (i + 1) * rw ? x_hi : (i + 1) * rw) - (x_lo > i * rw ? x_lo : i * rw);
      const uint64_t w = static_cast<uint64_t>(wx * wy);
      const uint8_t* p = row + i * channels;
      for (int c = 0; c < channels; ++c) acc[c] += w * p[c];
    }
  }
  const uint64_t total = static_cast<uint64_t>(sw * sh);
  for (int c = 0; c < channels; ++c) out[c] = static_cast<uint8_t>((acc[c] + total / 2) / total);
}

// The whole window into dst (out_height x out_width x channels, packed). Checks nothing: the
// caller passes a geometry GeometryFor made. Cost: O(out pixels x covered source pixels).
void ExactResizeCrop(const ResizeCropGeometry& g, const uint8_t* src, size_t pitch, int channels,
                     uint8_t* dst);

}  // namespace carpool

#endif  // CARPOOL_SERVER_EXACT_RESIZE_H_
