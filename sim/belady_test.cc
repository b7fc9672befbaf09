#include "sim/belady.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

namespace carpool {
namespace {

// The optimum by exhaustive search: after each request the cache may keep any subset of at most
// `capacity` samples of (what it held) + (the requested sample).
uint64_t BruteForce(const std::vector<uint32_t>& req, size_t i, std::vector<uint32_t> cache,
                    size_t capacity) {
  if (i == req.size()) return 0;
  const uint32_t s = req[i];
  const bool hit = std::find(cache.begin(), cache.end(), s) != cache.end();
  if (!hit) cache.push_back(s);
  uint64_t best = std::numeric_limits<uint64_t>::max();
  const size_t n = cache.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    if (static_cast<size_t>(__builtin_popcount(mask)) > capacity) continue;
    std::vector<uint32_t> kept;
    for (size_t b = 0; b < n; ++b) {
      if (mask & (1u << b)) kept.push_back(cache[b]);
    }
    best = std::min(best, BruteForce(req, i + 1, kept, capacity));
  }
  return best + (hit ? 0 : 1);
}

TEST(BeladyTest, HandBuiltSequence) {
  // Capacity 2: 1 2 3 1 3 2 -> misses 1, 2, 3 (evicts 2, needed last), hits 1 and 3, miss 2.
  std::vector<uint32_t> req = {1, 2, 3, 1, 3, 2};
  BeladyResult r = BeladyMin(req, 2);
  EXPECT_EQ(r.misses, 4u);
  EXPECT_EQ(r.evictions, 1u);
  EXPECT_EQ(BeladyMin(req, 3).misses, 3u);
  EXPECT_EQ(BeladyMin(req, 0).misses, 6u) << "no cache: every request is a miss";
  // 1 2 3 1 2: 3 is never needed again, so it is not cached at all.
  EXPECT_EQ(BeladyMin(std::vector<uint32_t>{1, 2, 3, 1, 2}, 2).misses, 3u);
  EXPECT_EQ(BeladyMin({}, 4).misses, 0u);
}

TEST(BeladyTest, BypassesASampleNeededLast) {
  // Capacity 1: 1 9 1 9 misses 1, 9 (bypassed or not: a tie), hit 1, miss 9.
  std::vector<uint32_t> req = {1, 9, 1, 9};
  EXPECT_EQ(BeladyMin(req, 1).misses, 3u);
  std::vector<uint32_t> once = {1, 7, 1};
  BeladyResult r = BeladyMin(once, 1);
  EXPECT_EQ(r.misses, 2u);
  EXPECT_EQ(r.evictions, 0u);
}

TEST(BeladyTest, MatchesExhaustiveSearch) {
  std::mt19937 gen(5);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t len = 1 + gen() % 10;
    const uint32_t distinct = 1 + gen() % 5;
    const size_t capacity = gen() % 4;
    std::vector<uint32_t> req(len);
    for (auto& x : req) x = gen() % distinct;
    ASSERT_EQ(BeladyMin(req, capacity).misses, BruteForce(req, 0, {}, capacity))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace carpool
