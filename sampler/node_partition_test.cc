#include "sampler/node_partition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace carpool {
namespace {

Roaring Range(uint32_t lo, uint32_t hi) {
  Roaring r;
  r.addRange(lo, hi);
  return r;
}

TEST(NodePartitionTest, PartsAreDisjointAndCoverTheDataset) {
  const Roaring ids = Range(1, 10001);
  for (uint32_t nodes : {1u, 2u, 3u, 8u}) {
    Roaring all;
    uint64_t total = 0;
    for (uint32_t k = 0; k < nodes; ++k) {
      Roaring part = NodePart(ids, 7, k, nodes);
      EXPECT_TRUE((all & part).isEmpty()) << nodes << " nodes, part " << k << " overlaps";
      all |= part;
      total += part.cardinality();
      for (uint32_t id : part) ASSERT_EQ(NodeOfSample(id, 7, nodes), k);
    }
    EXPECT_EQ(all, ids) << nodes << " nodes";
    EXPECT_EQ(total, ids.cardinality());
    EXPECT_EQ(NodePartSizes(ids, 7, nodes).size(), nodes);
  }
}

// Each part is a uniform random share: sizes are Binomial(n, 1/K), within 4.5 sigma.
TEST(NodePartitionTest, PartSizesAreBalancedAndTheSeedMatters) {
  const Roaring ids = Range(1, 100001);
  const uint32_t nodes = 4;
  std::vector<uint64_t> sizes = NodePartSizes(ids, 11, nodes);
  const double mean = 100000.0 / nodes, sd = std::sqrt(100000.0 * 0.25 * 0.75);
  for (uint64_t s : sizes) EXPECT_LT(std::abs(static_cast<double>(s) - mean), 4.5 * sd) << s;
  uint32_t moved = 0;
  for (uint32_t id = 1; id <= 1000; ++id) moved += NodeOfSample(id, 11, 4) != NodeOfSample(id, 12, 4);
  EXPECT_GT(moved, 600u);  // another seed is another partition (3/4 move on average)
}

TEST(NodePartitionTest, AgreedBatchesCoverTheLargestOrFitTheSmallest) {
  const std::vector<uint64_t> sizes = {1000, 1030, 970};
  EXPECT_EQ(AgreedBatchesPerEpoch(sizes, 100, false), 11u);  // 1030 -> 10 full + 1 partial
  EXPECT_EQ(AgreedBatchesPerEpoch(sizes, 100, true), 9u);    // 970 -> 9 full
  EXPECT_EQ(AgreedBatchesPerEpoch({1000}, 100, false), 10u);
  EXPECT_EQ(AgreedBatchesPerEpoch({1000}, 300, true), 3u);
}

}  // namespace
}  // namespace carpool
