// The GPU side of decode=gpu's resize (server/exact_resize.h): one launch resizes and crops a
// batch of decoded RGB images into their prepared samples, with the exact integer expression the
// CPU uses, so both give the same bytes.
#ifndef CARPOOL_SERVER_GPU_RESIZE_KERNEL_H_
#define CARPOOL_SERVER_GPU_RESIZE_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "server/exact_resize.h"

namespace carpool::gpu {

// One image: its decoded pixels (device, interleaved, rows `src_pitch` bytes apart) and where its
// prepared sample goes (device, packed out_height x out_width x channels).
struct ResizeImage {
  ResizeCropGeometry geometry;
  const uint8_t* src;
  uint8_t* dst;
  uint32_t src_pitch;
  int32_t channels;
};

// Enqueues the resize of images[0, count) (a device array) on `stream`; max_out_pixels is the
// largest out_width x out_height among them. Returns the launch error, if any.
cudaError_t LaunchExactResize(const ResizeImage* images, int count, int max_out_pixels,
                              cudaStream_t stream);

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_RESIZE_KERNEL_H_
