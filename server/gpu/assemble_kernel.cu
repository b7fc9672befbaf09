#include <cuda_fp16.h>

#include "carpool/types.h"
#include "server/gpu/assemble_kernel.h"

namespace carpool::gpu {
namespace {

// The descriptors carry carpool::DType and Layout (carpool/types.h) as bytes; the host code
// static_casts them, so the kernel compares against the same definitions.
constexpr uint8_t kUint8 = static_cast<uint8_t>(DType::kUint8);
constexpr uint8_t kFloat16 = static_cast<uint8_t>(DType::kFloat16);
constexpr uint8_t kNCHW = static_cast<uint8_t>(Layout::kNCHW);

// The float value of byte v in channel c, in the order docs/transforms.md fixes:
// v / 255, then (unit - mean) / std, each an IEEE float32 operation rounded to nearest. The
// explicit _rn intrinsics keep nvcc from contracting or approximating (no FMA here anyway, but
// -use_fast_math would otherwise turn the divisions into approximations).
__device__ float UnitValue(const KernelJob& job, int c, int v) {
  const float unit = __fdiv_rn(static_cast<float>(v), 255.0f);
  return job.normalize ? __fdiv_rn(__fsub_rn(unit, job.mean[c]), job.std[c]) : unit;
}

template <typename Out>
__device__ Out Convert(const float* lut, int c, uint8_t v);

template <>
__device__ uint8_t Convert<uint8_t>(const float*, int, uint8_t v) {
  return v;
}

template <>
__device__ float Convert<float>(const float* lut, int c, uint8_t v) {
  return lut[c * 256 + v];
}

// Round to nearest, ties to even, like FloatToHalf.
template <>
__device__ uint16_t Convert<uint16_t>(const float* lut, int c, uint8_t v) {
  return __half_as_ushort(__float2half_rn(lut[c * 256 + v]));
}

template <typename Out, bool kPlanar, int kC>
__device__ void TransformImage(const uint8_t* src, const KernelImage& im, const KernelJob& job,
                               const float* lut) {
  const int width = job.out_width;
  const int pixels = job.out_height * width;
  Out* dst = static_cast<Out*>(im.dst);
  for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < pixels; p += gridDim.y * blockDim.x) {
    const int oy = p / width;
    const int ox = p - oy * width;
    const int sx = im.flip ? im.x + width - 1 - ox : im.x + ox;
    const uint8_t* px = src + (static_cast<size_t>(im.y + oy) * im.src_width + sx) * kC;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const Out value = Convert<Out>(lut, c, px[c]);
      if constexpr (kPlanar) {
        dst[static_cast<size_t>(c) * pixels + p] = value;
      } else {
        dst[static_cast<size_t>(p) * kC + c] = value;
      }
    }
  }
}

template <typename Out, bool kPlanar>
__device__ void DispatchChannels(const uint8_t* src, const KernelImage& im, const KernelJob& job,
                                 const float* lut) {
  switch (job.channels) {
    case 1:
      return TransformImage<Out, kPlanar, 1>(src, im, job, lut);
    case 2:
      return TransformImage<Out, kPlanar, 2>(src, im, job, lut);
    case 3:
      return TransformImage<Out, kPlanar, 3>(src, im, job, lut);
    default:
      return TransformImage<Out, kPlanar, 4>(src, im, job, lut);
  }
}

template <typename Out>
__device__ void DispatchLayout(const uint8_t* src, const KernelImage& im, const KernelJob& job,
                               const float* lut) {
  if (job.layout == kNCHW) {
    DispatchChannels<Out, true>(src, im, job, lut);
  } else {
    DispatchChannels<Out, false>(src, im, job, lut);
  }
}

// The image's blocks copy its whole sample to im.keep between them, 16 bytes a thread a step
// where both ends allow it.
__device__ void KeepSample(const KernelImage& im) {
  const size_t first = static_cast<size_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.y) * blockDim.x;
  size_t done = 0;
  if ((reinterpret_cast<uintptr_t>(im.src) | reinterpret_cast<uintptr_t>(im.keep)) % 16 == 0) {
    const auto* from = reinterpret_cast<const uint4*>(im.src);
    auto* to = reinterpret_cast<uint4*>(im.keep);
    const size_t words = im.keep_bytes / 16;
    for (size_t i = first; i < words; i += stride) to[i] = from[i];
    done = words * 16;
  }
  for (size_t i = done + first; i < im.keep_bytes; i += stride) im.keep[i] = im.src[i];
}

__global__ void __launch_bounds__(kKernelThreads)
    AssembleKernel(const KernelJob* jobs, const KernelImage* images) {
  __shared__ float lut[kKernelMaxChannels * 256];
  const KernelImage im = images[blockIdx.x];
  const KernelJob job = jobs[im.job];
  const uint8_t* src = im.src;
  if (im.keep != nullptr) KeepSample(im);
  if (job.dtype == kUint8) {  // uniform per block: the barrier below is not divergent
    DispatchLayout<uint8_t>(src, im, job, lut);
    return;
  }
  for (int i = threadIdx.x; i < job.channels * 256; i += blockDim.x) {
    lut[i] = UnitValue(job, i / 256, i % 256);
  }
  __syncthreads();
  if (job.dtype == kFloat16) {
    DispatchLayout<uint16_t>(src, im, job, lut);
  } else {
    DispatchLayout<float>(src, im, job, lut);
  }
}

}  // namespace

cudaError_t LaunchAssembleKernel(const KernelJob* jobs, const KernelImage* images,
                                 int num_images, int blocks_per_image, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_images), static_cast<unsigned>(blocks_per_image));
  AssembleKernel<<<grid, kKernelThreads, 0, stream>>>(jobs, images);
  return cudaGetLastError();
}

}  // namespace carpool::gpu
