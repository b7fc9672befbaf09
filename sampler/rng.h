// The sampler's one random number generator: std::mt19937_64 plus an exact bounded draw.
// Thread-compatible: callers serialize access.
#ifndef CARPOOL_SAMPLER_RNG_H_
#define CARPOOL_SAMPLER_RNG_H_

#include <cstdint>
#include <random>

#include "common/splitmix.h"  // SplitMix64 derives the seeds of separate streams

namespace carpool {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  void Seed(uint64_t seed) { engine_.seed(seed); }

  // A uniform integer in [0, bound), exactly: Lemire's multiply-shift with rejection, so every
  // value has probability exactly 1/bound. REQUIRES: bound > 0.
  uint64_t Uniform(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(engine_()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
      while (low < threshold) {
        m = static_cast<unsigned __int128>(engine_()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // True with probability numerator / denominator, exactly. REQUIRES: 0 < denominator.
  bool Bernoulli(uint64_t numerator, uint64_t denominator) {
    return Uniform(denominator) < numerator;
  }

  uint64_t Next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

}  // namespace carpool

#endif  // CARPOOL_SAMPLER_RNG_H_
