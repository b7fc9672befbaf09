#include "server/worker_phases.h"

namespace carpool {

std::string_view WorkerPhaseName(WorkerPhase phase) {
  switch (phase) {
    case WorkerPhase::kRead: return "read";
    case WorkerPhase::kLock: return "lock";
    case WorkerPhase::kAllocate: return "allocate";
    case WorkerPhase::kDecode: return "decode";
    case WorkerPhase::kCommit: return "commit";
    case WorkerPhase::kTransient: return "transient";
    case WorkerPhase::kAssemble: return "assemble";
    case WorkerPhase::kGpuBuild: return "gpu_build";
    case WorkerPhase::kDeliver: return "deliver";
    case WorkerPhase::kCount: break;
  }
  return "unknown";
}

std::vector<std::pair<std::string_view, int32_t>> WorkerPhases::Now() const {
  std::vector<std::pair<std::string_view, int32_t>> out;
  for (size_t i = 0; i < counts_.size(); ++i) {
    out.emplace_back(WorkerPhaseName(static_cast<WorkerPhase>(i)),
                     counts_[i].load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace carpool
