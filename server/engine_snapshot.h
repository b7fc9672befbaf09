// A copy of the engine's statistics taken under its lock (Engine::Snapshot). `carpool status`
// (engine_stats.cc) and `/metrics` (metrics_text.h) both print one, so they agree by construction.
// docs/server.md describes the fields. A plain value: thread-compatible.
#ifndef CARPOOL_SERVER_ENGINE_SNAPSHOT_H_
#define CARPOOL_SERVER_ENGINE_SNAPSHOT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/sample_cache.h"
#include "sampler/sampling_tree.h"
#include "server/gpu_service.h"
#include "server/scheduler.h"

namespace carpool {

struct JobSnapshot {
  uint64_t id = 0;
  std::string dataset;
  uint32_t batch_size = 0, epochs = 0, epoch = 0;
  double progress = 0;    // queue entries done with / (epochs x dataset size)
  double rate = 0;        // samples per second, the scheduler's estimate
  uint64_t remaining = 0;  // of the epoch being decided
  uint64_t queue_depth = 0;  // decided, not yet delivered
  uint64_t deliveries = 0, batches = 0, skipped = 0, dropped = 0;
  uint32_t prefetch = 0, unreleased = 0;
  bool assembling = false, done = false;
  std::string device;  // "cpu" or "cuda:N"
  std::string prepare_spec;  // its dataset's: the key its samples are prepared under
  std::string decoder;       // who decodes its JPEGs: "cpu", "gpu-hardware", "gpu-hybrid"
  // A rank of a data-parallel job (world_size > 1): its key, and the group's padded entries.
  std::string job_key;
  uint32_t rank = 0, world_size = 1;
  uint64_t padded = 0;
  double held_s = 0;         // time held back by the pacing
  double client_bound = 0;   // recent fraction of time waiting on its own client
  double pace = 0;           // samples/s while its client had a batch (Scheduler::JobStats)
  std::optional<uint64_t> following;  // the scheduler participant whose order it copies
  uint64_t followed = 0;              // decisions copied from a leader
};

struct EngineSnapshot {
  std::string instance;
  double uptime_s = 0;
  size_t workers = 0;
  uint64_t lookahead = 0;  // in force: derived, or the --lookahead override
  PacingStats pacing;
  std::string policy;
  std::vector<std::string> prepare_specs;  // keyed apart, by slot (server/prepared_keys.h)
  std::vector<JobSnapshot> jobs;
  uint64_t jobs_created = 0, jobs_removed = 0;
  cache::CacheStats cache;
  uint64_t cached_preparations = 0, transient_preparations = 0;
  uint64_t gpu_decode_cpu_fallbacks = 0;  // decode=gpu samples prepared on the CPU
  uint64_t deliveries = 0, batches = 0, skipped = 0, bad_samples = 0, pins = 0;
  int64_t refcount_total = 0;
  uint64_t in_flight = 0;  // samples being prepared
  // Per-sample state: samples of the jobs present, samples with a state entry (those plus cached
  // samples no job uses), IDX files held in memory. All 0 on an idle server with an empty cache.
  uint64_t samples_known = 0, sample_states = 0, idx_files = 0;
  uint64_t rounds = 0;
  std::vector<SamplingTree::NodeStats> tree;
  double cpu_seconds = 0, coordinator_seconds = 0;
  size_t workers_busy = 0, worker_queue = 0;  // threads in a task; tasks waiting for one
  double worker_lock_wait_seconds = 0;        // worker tasks waiting for the engine's lock
  std::vector<std::pair<std::string, int32_t>> worker_phases;  // workers in each phase now
  std::vector<GpuCounters> gpus;  // one per GPU served

  uint64_t preparations() const { return cached_preparations + transient_preparations; }
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_ENGINE_SNAPSHOT_H_
