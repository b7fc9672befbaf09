// SchedulerSim: the scheduler and the cache index in simulated time, without I/O. This is what
// `carpool sim --cache N` runs, and what the eviction-policy experiment sweeps. The Scheduler and
// the CacheIndex are the server's own classes; only the clock and the preparations are simulated.
//
// Time advances in ticks. A job with speed S is owed S deliveries per tick (fractional speeds
// accumulate), starting at its start tick; it leaves after its epochs. Before each delivery the
// scheduler runs whatever rounds its trigger asks for (a queue below the prefetch depth), with
// every job below the look-ahead L taking part. A delivery looks its sample up in the cache: a hit,
// or a miss, which is one preparation followed by an insertion that evicts by policy. The samples
// a job receives in one tick form its batch and stay pinned until the batch is complete.
// Thread-compatible.
#ifndef CARPOOL_SERVER_SCHEDULER_SIM_H_
#define CARPOOL_SERVER_SCHEDULER_SIM_H_

#include <cstdint>
#include <functional>
#include <roaring/roaring.hh>
#include <string>
#include <vector>

#include "cache/cache_index.h"
#include "carpool/status.h"
#include "sampler/sampling_tree.h"

namespace carpool {

struct SimJobSpec {
  std::string name;
  Roaring dataset;
  double start = 0;  // tick at which the job joins
  double speed = 1;  // deliveries per tick, > 0
  uint32_t epochs = 1;
};

struct SchedulerSimOptions {
  uint64_t cache_samples = 0;  // 0: no cache, every delivery is a preparation
  cache::EvictionPolicy policy = cache::EvictionPolicy::kNextUse;
  uint64_t lookahead = 1024;  // L, samples
  uint64_t prefetch = 4;      // trigger depth, samples
  uint64_t seed = 1;
  double rate_time_constant = 16;  // ticks; see SchedulerOptions
  bool keep_requests = false;      // fill SchedulerSimResult::requests
};

// One delivery, in simulated order.
struct SimDelivery {
  uint64_t tick;
  size_t job;  // index into the specs
  uint32_t epoch;
  SampleId sample;
  bool hit;
};

struct SchedulerSimResult {
  struct Job {
    std::string name;
    uint64_t deliveries = 0;
    uint64_t preparations = 0;  // misses on this job's deliveries
    uint32_t epochs = 0;        // completed
    uint64_t finish_tick = 0;
  };
  uint64_t ticks = 0;
  uint64_t rounds = 0;
  uint64_t deliveries = 0;
  uint64_t hits = 0;
  uint64_t preparations = 0;  // misses
  uint64_t evictions = 0;
  uint64_t belady_preparations = 0;  // Belady's MIN on the same request sequence
  // Of the deliveries of samples drawn in a round shared by several jobs, how many.
  uint64_t shared_deliveries = 0;
  std::vector<Job> jobs;
  std::vector<SampleId> requests;  // the delivered samples in order, with keep_requests
};

// Runs the jobs to completion. Errors: no job, an empty dataset, a speed that is not positive or
// finite, a negative start, epochs of 0, a prefetch or look-ahead of 0.
Result<SchedulerSimResult> RunSchedulerSim(
    const std::vector<SimJobSpec>& jobs, const SchedulerSimOptions& options,
    const std::function<void(const SimDelivery&)>& on_delivery = nullptr);

}  // namespace carpool

#endif  // CARPOOL_SERVER_SCHEDULER_SIM_H_
