#include "sampler/roaring_node.h"

#include <gtest/gtest.h>

#include <vector>

#include "sampler/stats_testing.h"

namespace carpool {
namespace {

TEST(RoaringNodeTest, WithoutRunsKeepsTheSetAndDropsRuns) {
  Roaring r;
  r.addRange(5, 50);             // small run: array
  r.addRange(65536, 3 * 65536);  // full containers: bitsets
  r.add(1000000);
  r.runOptimize();
  Roaring plain = WithoutRuns(r);
  EXPECT_TRUE(plain == r);
  // Runs would make this bitmap tiny; without them it costs arrays and bitsets.
  EXPECT_GT(plain.getSizeInBytes(), 2 * 8192u);
  Roaring again = plain;
  EXPECT_TRUE(again.runOptimize());  // there were runs to make, so none were left
}

// A node with an array container, a dense bitset, a sparse bitset (where rejection tries often
// miss and the rank fallback runs) and a run container: each id must come up uniformly
// (Pearson chi-square, df = |node| - 1, at significance 1e-3).
TEST(RoaringNodeTest, UniformElementIsUniform) {
  Roaring node;
  for (uint32_t i = 0; i < 40; ++i) node.add(3 * i);                 // array
  for (uint32_t i = 0; i < 60000; ++i) node.add(65536 + i);          // dense bitset
  for (uint32_t i = 0; i < 4200; ++i) node.add(2 * 65536 + 15 * i);  // sparse bitset
  Roaring runs;
  runs.addRange(5 * 65536, 5 * 65536 + 3000);
  runs.runOptimize();
  node |= runs;  // run container
  const uint64_t size = node.cardinality();
  std::vector<uint32_t> ids(size);
  node.toUint32Array(ids.data());
  std::vector<uint64_t> counts(size, 0);
  Rng rng(99);
  const uint64_t draws = 40 * size;
  for (uint64_t t = 0; t < draws; ++t) {
    const uint32_t x = UniformElement(node, size, rng);
    auto it = std::lower_bound(ids.begin(), ids.end(), x);
    ASSERT_TRUE(it != ids.end() && *it == x) << x;
    ++counts[it - ids.begin()];
  }
  const double p =
      testing::ChiSquarePValue(testing::PearsonUniform(counts), static_cast<double>(size - 1));
  EXPECT_GE(p, 1e-3);
  // Containers by weight: the sparse bitset's share must match its cardinality (z bound).
  uint64_t sparse = 0;
  for (uint64_t i = 0; i < size; ++i) sparse += (ids[i] >> 16) == 2 ? counts[i] : 0;
  EXPECT_GE(testing::BinomialZPValue(sparse, draws, 4200.0 / static_cast<double>(size)), 1e-3);
}

}  // namespace
}  // namespace carpool
