// `carpool sim --cache N ...`: the jobs of `carpool sim` run through the server's Scheduler and
// CacheIndex in simulated ticks (sim/scheduler_sim.h) instead of the bare sampler loop.
// In this mode a job's @START is a tick and xSPEED is deliveries per tick (any number > 0); the
// timing flags (--jitter, --jitter-period, --prep-capacity, --batch, --pacing) model a server that
// can fall behind.
#ifndef CARPOOL_TOOLS_SIM_CACHE_MODE_H_
#define CARPOOL_TOOLS_SIM_CACHE_MODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_index.h"
#include "sim/sim.h"

namespace carpool::tools {

struct CacheModeOptions {
  uint64_t cache = 0;  // samples
  cache::EvictionPolicy policy = cache::EvictionPolicy::kNextUse;
  uint64_t lookahead = 0;  // 0: derived by the scheduler
  uint64_t prefetch = 4;
  uint64_t epochs = 1;
  uint64_t seed = 1;
  double jitter = 0;  // see SchedulerSimOptions
  uint64_t jitter_period = 1;
  double prep_capacity = 0;  // preparations per tick; 0: unlimited
  uint64_t batch = 0;        // 0: a job's deliveries of one tick
  bool pacing = true;
  bool follow = true;
  std::string trace_path;       // CSV tick,job,epoch,sample,hit; empty: none
  std::string tick_trace_path;  // CSV tick,job,delivered,held,starved,queued,owed,credit
  bool json = false;
};

// Runs the simulation and prints its summary to stdout. Returns the process exit code; errors go
// to stderr as one line.
int RunCacheMode(const std::vector<SimJob>& jobs, const CacheModeOptions& options);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_SIM_CACHE_MODE_H_
