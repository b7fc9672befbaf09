#include "server/gpu/resize_kernel.h"

namespace carpool::gpu {
namespace {

constexpr int kResizeThreads = 256;

// blockIdx.y: the image; x: its output pixels, one per thread.
__global__ void ExactResizeKernel(const ResizeImage* images) {
  const ResizeImage& im = images[blockIdx.y];
  const int pixel = static_cast<int>(blockIdx.x) * kResizeThreads + static_cast<int>(threadIdx.x);
  const int width = im.geometry.out_width;
  if (pixel >= width * im.geometry.out_height) return;
  const int ox = pixel % width, oy = pixel / width;
  ExactResizePixel(im.geometry, im.src, im.src_pitch, im.channels, ox, oy,
                   im.dst + static_cast<size_t>(pixel) * im.channels);
}

}  // namespace

cudaError_t LaunchExactResize(const ResizeImage* images, int count, int max_out_pixels,
                              cudaStream_t stream) {
  if (count <= 0 || max_out_pixels <= 0) return cudaSuccess;
  const dim3 grid((max_out_pixels + kResizeThreads - 1) / kResizeThreads, count);
  ExactResizeKernel<<<grid, kResizeThreads, 0, stream>>>(images);
  return cudaGetLastError();
}

}  // namespace carpool::gpu
