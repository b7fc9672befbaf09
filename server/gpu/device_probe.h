// What CUDA devices this process can use. A machine without a GPU, without a driver, or with
// CUDA_VISIBLE_DEVICES empty has 0 devices: that is not an error, the CPU batch path serves it.
// Stateless functions: thread-safe.
#ifndef CARPOOL_SERVER_GPU_DEVICE_PROBE_H_
#define CARPOOL_SERVER_GPU_DEVICE_PROBE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "carpool/status.h"

namespace carpool::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;
};

// The number of usable CUDA devices; 0 when cudaGetDeviceCount reports no device or no driver.
int CudaDeviceCount();

// One entry per device, in CUDA's order; empty on a machine without one. Errors only for a
// device that is present but cannot be queried.
Result<std::vector<DeviceInfo>> ListCudaDevices();

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_DEVICE_PROBE_H_
