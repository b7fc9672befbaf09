// SchedulerSim: the scheduler and the cache index in simulated time, without I/O. This is what
// `carpool sim --cache N` runs, and what the eviction-policy experiment sweeps. The Scheduler and
// the CacheIndex are the server's own classes; only the clock, the jobs' clients and the
// preparation workers are simulated.
//
// Time advances in ticks. A job with speed S is owed S deliveries per tick (fractional speeds
// accumulate), starting at its start tick; it leaves after its epochs. With jitter, S is multiplied
// by a random factor max(0, 1 + jitter N(0,1)) that lasts `jitter_period` ticks, so identical jobs
// drift apart as real ones do. A job takes its deliveries a batch at a time: `batch` samples, or
// (batch 0) what it is owed in the tick. Before a batch the scheduler's MayTake may hold the job
// (coupled pacing); the batch's samples stay pinned until it is complete. Before each delivery the
// scheduler runs whatever rounds its trigger asks for. A delivery looks its sample up in the
// cache: a hit, or a miss, which is one preparation followed by an insertion that evicts by policy.
//
// With a preparation capacity P, the server prepares at most P samples per tick: a miss with the
// tick's capacity spent waits for a later tick (the job keeps its credit, up to two batches), and
// what is left at the end of the tick prepares queued samples ahead, earliest deadline first, as
// the engine's idle workers do. Without one (0), a miss costs nothing and nothing is prepared
// ahead. Thread-compatible.
#ifndef CARPOOL_SIM_SCHEDULER_SIM_H_
#define CARPOOL_SIM_SCHEDULER_SIM_H_

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
  uint64_t lookahead = 0;  // L, samples; 0: derived by the scheduler from the cache and the jobs
  uint64_t prefetch = 4;   // trigger depth, samples (raised to one batch)
  uint64_t seed = 1;       // the sampling tree's and the jitter's generators
  double rate_time_constant = 16;  // ticks; see SchedulerOptions
  bool keep_requests = false;      // fill SchedulerSimResult::requests
  // Standard deviation of a job's speed factor max(0, 1 + jitter N(0,1)); 0: exact speeds. A
  // factor lasts jitter_period ticks (1: a new one every tick; more: a job slowed for a while).
  double jitter = 0;
  uint64_t jitter_period = 1;
  // Preparations per tick (fractions accumulate); 0: unlimited, and nothing is prepared ahead.
  double prep_capacity = 0;
  // Samples per batch: the unit of MayTake and of pinning. 0: a job's deliveries of one tick.
  uint64_t batch = 0;
  bool pacing = true;  // SchedulerOptions::pacing; needs a cache (the capacity is its window)
  bool follow = true;  // SchedulerOptions::follow: a new job's first epoch copies a running job's
};

// One delivery, in simulated order.
struct SimDelivery {
  uint64_t tick;
  size_t job;  // index into the specs
  uint32_t epoch;
  SampleId sample;
  bool hit;
};

// One running job at the end of one tick, for pacing traces.
struct SimJobTick {
  uint64_t tick;
  size_t job;          // index into the specs
  uint64_t delivered;  // deliveries in this tick
  bool held;           // MayTake refused its next batch
  bool starved;        // a miss found the tick's preparation capacity spent
  uint64_t queued;     // its decided queue
  uint64_t owed;       // the scheduler's owed samples (all jobs)
  double credit;       // deliveries it is still owed
};

struct SchedulerSimResult {
  struct Job {
    std::string name;
    uint64_t deliveries = 0;
    uint64_t preparations = 0;  // misses on this job's deliveries
    uint32_t epochs = 0;        // completed
    uint64_t finish_tick = 0;
    uint64_t held_ticks = 0;     // ticks in which MayTake refused its next batch
    uint64_t starved_ticks = 0;  // ticks in which it waited for preparation capacity
  };
  uint64_t ticks = 0;
  uint64_t rounds = 0;
  uint64_t deliveries = 0;
  uint64_t hits = 0;
  // Every preparation: misses of deliveries, plus prepared_ahead. hits + preparations -
  // prepared_ahead == deliveries.
  uint64_t preparations = 0;
  uint64_t prepared_ahead = 0;  // by leftover capacity, before any job asked for the sample
  uint64_t evictions = 0;
  uint64_t belady_preparations = 0;  // Belady's MIN on the same request sequence
  // Of the deliveries of samples drawn in a round shared by several jobs, how many.
  uint64_t shared_deliveries = 0;
  // Pacing (the largest values over the ticks with a running job): the L in force, the window of
  // owed samples and the owed samples; the scheduler's holds (batches refused at least once) and
  // lifts (batches let past the window for a client-bound lagger).
  uint64_t lookahead = 0;
  uint64_t window = 0;
  uint64_t max_owed = 0;
  uint64_t holds = 0;
  uint64_t followed = 0;  // decisions copied from a leader (Scheduler::followed)
  uint64_t lifts = 0;
  std::vector<Job> jobs;
  std::vector<SampleId> requests;  // the delivered samples in order, with keep_requests
};

// What a run reports as it goes; either may be empty.
struct SimObserver {
  std::function<void(const SimDelivery&)> on_delivery;
  std::function<void(const SimJobTick&)> on_job_tick;
};

// Checks the jobs and options; RunSchedulerSim starts with it. Errors: no job, an empty dataset,
// a speed that is not positive or finite, a negative start, epochs of 0, a prefetch of 0, a
// jitter or preparation capacity that is negative or not finite, a jitter period of 0, a batch
// larger than an explicit look-ahead.
Status ValidateSchedulerSim(const std::vector<SimJobSpec>& jobs,
                            const SchedulerSimOptions& options);

// Runs the jobs to completion. Internal error: the pacing holds jobs and nothing is delivered for
// longer than any job needs to be owed a batch (a deadlock that would never end).
Result<SchedulerSimResult> RunSchedulerSim(const std::vector<SimJobSpec>& jobs,
                                           const SchedulerSimOptions& options,
                                           const SimObserver& observer);
Result<SchedulerSimResult> RunSchedulerSim(
    const std::vector<SimJobSpec>& jobs, const SchedulerSimOptions& options,
    const std::function<void(const SimDelivery&)>& on_delivery = nullptr);

}  // namespace carpool

#endif  // CARPOOL_SIM_SCHEDULER_SIM_H_
