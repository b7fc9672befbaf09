// How many worker threads are in each phase of their tasks right now: a gauge per phase that
// `carpool status` and bench/gpu_probe.py sample to find where workers block (a phase whose
// count stays high while the workers use less CPU than their number). Thread-safe; entering or
// leaving a phase costs two relaxed atomic additions.
#ifndef CARPOOL_SERVER_WORKER_PHASES_H_
#define CARPOOL_SERVER_WORKER_PHASES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace carpool {

enum class WorkerPhase : uint8_t {
  kRead,        // reading a sample's bytes (file, IDX record)
  kLock,        // waiting for the engine's lock
  kAllocate,    // reserving the sample's cache slot (under the engine's lock)
  kDecode,      // decoding and resizing into the slot
  kCommit,      // publishing the slot in the cache
  kTransient,   // preparing a sample its batch needs and the cache could not hold
  kAssemble,    // a CPU batch: the transform into the job's slot
  kGpuBuild,    // a GPU batch: uploads, the kernel and the stream's completion
  kDeliver,     // publishing the slot and sending batch-ready
  kCount,
};

std::string_view WorkerPhaseName(WorkerPhase phase);

class WorkerPhases {
 public:
  class Scope {  // in `phase` from construction to destruction; do not nest two of one pool
   public:
    Scope(WorkerPhases& phases, WorkerPhase phase) : counter_(phases.Counter(phase)) {
      counter_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Scope() { counter_.fetch_sub(1, std::memory_order_relaxed); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::atomic<int32_t>& counter_;
  };

  // (name, threads in it now) for every phase, in enum order.
  std::vector<std::pair<std::string_view, int32_t>> Now() const;

 private:
  std::atomic<int32_t>& Counter(WorkerPhase phase) { return counts_[static_cast<size_t>(phase)]; }
  std::array<std::atomic<int32_t>, static_cast<size_t>(WorkerPhase::kCount)> counts_{};
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_WORKER_PHASES_H_
