// GpuService where CUDA is not built: no GPU is ever served, and asking for one is a clear error.
#include <fmt/format.h>

#include "server/gpu_service.h"

namespace carpool {

int VisibleGpuCount() { return 0; }

Result<std::vector<std::unique_ptr<GpuService>>> CreateGpuServices(
    const GpuServiceOptions& options) {
  if (options.devices.empty()) return std::vector<std::unique_ptr<GpuService>>();
  return Status::Unavailable(fmt::format(
      "--gpus: this carpool was built without CUDA, so it cannot serve GPU {}; rebuild with "
      "-DCARPOOL_WITH_CUDA=ON (needs nvcc) or use --gpus none",
      options.devices.front()));
}

}  // namespace carpool
