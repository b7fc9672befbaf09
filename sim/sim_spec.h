// The job specs of `carpool sim`:
//   NAME=LO:HI[%FRACTION][@START][xSPEED][/EPOCHS]   ids [LO, HI), optionally a seeded random
//                                                   fraction
//   NAME=dataset:REGISTERED_NAME[@START][xSPEED][/EPOCHS]
// START is the round at which the job joins (default 0); SPEED in (0, 1] is the probability that
// the job takes part in a round (default 1); EPOCHS overrides `--epochs` for this job (a sweep's
// trial stopped early). With a cache (`carpool sim --cache N`, see
// sim/scheduler_sim.h) START is a tick and SPEED any number > 0 of deliveries per tick.
// Pure parsing; thread-compatible.
#ifndef CARPOOL_SIM_SIM_SPEC_H_
#define CARPOOL_SIM_SIM_SPEC_H_

#include <cstdint>
#include <roaring/roaring.hh>
#include <string>
#include <string_view>

#include "carpool/status.h"

namespace carpool {

struct JobSpec {
  std::string name;
  std::string dataset;  // set for dataset:NAME; empty for an id range
  uint64_t lo = 0;      // id range [lo, hi) when dataset is empty
  uint64_t hi = 0;
  double fraction = 1.0;  // in (0, 1]: keep round(fraction·(hi-lo)) of the range's ids
  uint64_t start = 0;
  double speed = 1.0;
  uint32_t epochs = 0;  // 0: the --epochs every job runs
};

inline constexpr std::string_view kJobSpecGrammar =
    "NAME=LO:HI[%FRACTION][@START][xSPEED][/EPOCHS] or "
    "NAME=dataset:REGISTERED_NAME[@START][xSPEED][/EPOCHS]";

// Parses one --job value; SPEED must lie in (0, max_speed] (infinity: any positive speed).
// Errors name the bad value and repeat the grammar.
Result<JobSpec> ParseJobSpec(std::string_view arg, double max_speed = 1.0);

// The ids of a range spec: [lo, hi), or exactly round(fraction·(hi-lo)) of them chosen uniformly
// with a generator seeded by `seed`. REQUIRES: spec.dataset is empty. InvalidArgument if the
// fraction keeps no id.
Result<Roaring> RangeIds(const JobSpec& spec, uint64_t seed);

}  // namespace carpool

#endif  // CARPOOL_SIM_SIM_SPEC_H_
