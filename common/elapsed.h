// NanosSince: nanoseconds of the steady clock since `start`, for the counters that add up wall
// time by phase (the engine's lock waits, a GPU build's phases). O(1).
#ifndef CARPOOL_COMMON_ELAPSED_H_
#define CARPOOL_COMMON_ELAPSED_H_

#include <chrono>
#include <cstdint>

namespace carpool {

inline uint64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
}

}  // namespace carpool

#endif  // CARPOOL_COMMON_ELAPSED_H_
