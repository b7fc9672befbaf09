// Belady's MIN: the offline optimum number of misses of a cache of `capacity` samples on a known
// request sequence, the reference for the eviction policies in `carpool sim`.
// On a miss with a full cache it keeps the `capacity` samples whose next requests come soonest,
// among the cached ones and the requested one: the sample requested furthest in the future (or
// never again) is evicted, or, if that is the requested sample itself, it is not cached (served
// from a transient buffer, as the server does when the cache is full of pinned samples). With
// that bypass MIN is optimal for any demand-fetching cache, so no policy can need fewer misses.
// Pure function; thread-safe.
#ifndef CARPOOL_SIM_BELADY_H_
#define CARPOOL_SIM_BELADY_H_

#include <cstdint>
#include <span>

namespace carpool {

struct BeladyResult {
  uint64_t misses = 0;     // preparations
  uint64_t evictions = 0;  // cached samples dropped for a sample needed sooner
};

// Cost: O(n log capacity) time, O(n) memory, n = requests.size().
BeladyResult BeladyMin(std::span<const uint32_t> requests, uint64_t capacity);

}  // namespace carpool

#endif  // CARPOOL_SIM_BELADY_H_
