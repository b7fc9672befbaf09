// The device side of GpuAssembler: plain descriptors shared by the host code (g++) and the kernel
// (nvcc), and the launch. One block row per output image; every block of an image builds its
// job's value table in shared memory, then gathers, crops, flips and converts its pixels, and
// copies its share of the sample to `keep` where one is given.
#ifndef CARPOOL_SERVER_GPU_ASSEMBLE_KERNEL_H_
#define CARPOOL_SERVER_GPU_ASSEMBLE_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace carpool::gpu {

inline constexpr int kKernelMaxChannels = 4;
inline constexpr int kKernelThreads = 256;

// Per job: what every image of its batch is turned into.
struct KernelJob {
  float mean[kKernelMaxChannels];
  float std[kKernelMaxChannels];
  int32_t channels;
  int32_t out_height;
  int32_t out_width;
  uint8_t dtype;      // carpool::DType value (carpool/types.h)
  uint8_t layout;     // carpool::Layout value (carpool/types.h)
  uint8_t normalize;  // 0 or 1
  uint8_t reserved;
};

// Per output image: where its prepared sample sits on the device and its crop window.
struct KernelImage {
  const uint8_t* src;  // device address of the prepared sample: in staging or the resident area
  void* dst;            // device address of the output image
  int32_t src_width;    // pixels per row of the prepared sample
  int32_t y;            // window top-left corner
  int32_t x;
  int32_t flip;
  int32_t job;  // index into the job table
  int32_t reserved;
  // Null, or where the image's whole prepared sample (keep_bytes of src) is also written: a
  // resident block filled by the kernel that reads it, with no copy of its own.
  uint8_t* keep;
  uint64_t keep_bytes;
};
// g++ writes the table, nvcc reads it: one layout on both.
static_assert(sizeof(KernelImage) == 56 && offsetof(KernelImage, keep) == 40,
              "KernelImage's layout is shared by host and device code");

// Enqueues the kernel on `stream` over images[0, num_images) with blocks_per_image blocks each.
// jobs and images (and every image's src) are device pointers. Returns the launch error, if any (cudaGetLastError).
cudaError_t LaunchAssembleKernel(const KernelJob* jobs, const KernelImage* images,
                                 int num_images, int blocks_per_image, cudaStream_t stream);

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_ASSEMBLE_KERNEL_H_
