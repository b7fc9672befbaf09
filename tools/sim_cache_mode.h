// `carpool sim --cache N ...`: the jobs of `carpool sim` run through the server's Scheduler and
// CacheIndex in simulated ticks (server/scheduler_sim.h) instead of the bare sampler loop.
// In this mode a job's @START is a tick and xSPEED is deliveries per tick (any number > 0).
#ifndef CARPOOL_TOOLS_SIM_CACHE_MODE_H_
#define CARPOOL_TOOLS_SIM_CACHE_MODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_index.h"
#include "sampler/sim.h"

namespace carpool::tools {

struct CacheModeOptions {
  uint64_t cache = 0;  // samples
  cache::EvictionPolicy policy = cache::EvictionPolicy::kNextUse;
  uint64_t lookahead = 1024;
  uint64_t prefetch = 4;
  uint64_t epochs = 1;
  uint64_t seed = 1;
  std::string trace_path;  // CSV tick,job,epoch,sample,hit; empty: none
  bool json = false;
};

// Runs the simulation and prints its summary to stdout. Returns the process exit code; errors go
// to stderr as one line.
int RunCacheMode(const std::vector<SimJob>& jobs, const CacheModeOptions& options);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_SIM_CACHE_MODE_H_
