#include "server/gpu/device_probe.h"

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include "server/gpu/cuda_check.h"

namespace carpool::gpu {

int CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // No device, no driver, or a driver older than the runtime: all mean "no GPU here".
    cudaGetLastError();
    return 0;
  }
  return count;
}

Result<std::vector<DeviceInfo>> ListCudaDevices() {
  std::vector<DeviceInfo> devices;
  const int count = CudaDeviceCount();
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (Status s = CudaCheck(cudaGetDeviceProperties(&prop, i),
                             fmt::format("cudaGetDeviceProperties(device {})", i));
        !s.ok()) {
      return s;
    }
    devices.push_back({.index = i,
                       .name = prop.name,
                       .compute_major = prop.major,
                       .compute_minor = prop.minor,
                       .multiprocessors = prop.multiProcessorCount,
                       .memory_bytes = prop.totalGlobalMem});
  }
  return devices;
}

}  // namespace carpool::gpu
