// splitmix64 (Steele, Lea and Flood 2014), the one definition every component uses: a
// stateless mixer that derives independent seeds and hashes, and a stream that advances it.
// Both O(1), header-only, thread-safe (pure).
#ifndef CARPOOL_COMMON_SPLITMIX_H_
#define CARPOOL_COMMON_SPLITMIX_H_

#include <cstdint>

namespace carpool {

inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ULL;

// The splitmix64 output for state x: a well-mixed 64-bit function of x.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += kSplitMixGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The next value of the splitmix64 stream whose state is `state`, advancing it.
constexpr uint64_t SplitMix64Next(uint64_t& state) {
  const uint64_t out = SplitMix64(state);
  state += kSplitMixGamma;
  return out;
}

static_assert(SplitMix64(0) == 0xe220a8397b1dcdafULL, "splitmix64 reference value");

}  // namespace carpool

#endif  // CARPOOL_COMMON_SPLITMIX_H_
