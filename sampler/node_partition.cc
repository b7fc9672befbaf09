#include "sampler/node_partition.h"

#include <algorithm>

#include "common/splitmix.h"

namespace carpool {

uint32_t NodeOfSample(uint32_t sample, uint64_t seed, uint32_t nodes) {
  if (nodes <= 1) return 0;
  return static_cast<uint32_t>(SplitMix64(seed + SplitMix64(sample)) % nodes);
}

Roaring NodePart(const Roaring& ids, uint64_t seed, uint32_t node, uint32_t nodes) {
  if (nodes <= 1) return ids;
  Roaring part;
  for (uint32_t id : ids) {
    if (NodeOfSample(id, seed, nodes) == node) part.add(id);
  }
  part.runOptimize();
  return part;
}

std::vector<uint64_t> NodePartSizes(const Roaring& ids, uint64_t seed, uint32_t nodes) {
  if (nodes <= 1) return {ids.cardinality()};  // no hashing on a one-node job's join
  std::vector<uint64_t> sizes(nodes, 0);
  for (uint32_t id : ids) ++sizes[NodeOfSample(id, seed, nodes)];
  return sizes;
}

uint64_t AgreedBatchesPerEpoch(const std::vector<uint64_t>& part_sizes, uint64_t global_batch,
                               bool drop_last) {
  if (part_sizes.empty() || global_batch == 0) return 0;
  if (drop_last) {
    return *std::min_element(part_sizes.begin(), part_sizes.end()) / global_batch;
  }
  const uint64_t largest = *std::max_element(part_sizes.begin(), part_sizes.end());
  return (largest + global_batch - 1) / global_batch;
}

}  // namespace carpool
