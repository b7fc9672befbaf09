// The cross-node rule for data-parallel jobs that span K nodes: node k serves the samples with
// SplitMix64(partition_seed + SplitMix64(id)) mod K == k. Every server of a sweep uses the same
// seed (`carpool server --partition-seed`), so jobs that overlap on the same nodes share on every
// node, and every sample belongs to exactly one node. Pure functions, thread-safe.
#ifndef CARPOOL_SAMPLER_NODE_PARTITION_H_
#define CARPOOL_SAMPLER_NODE_PARTITION_H_

#include <cstdint>
#include <vector>

#include <roaring/roaring.hh>

namespace carpool {

inline constexpr uint64_t kDefaultPartitionSeed = 0x6361727070ULL;  // "carpp"

// The node (0..nodes-1) that serves `sample`. O(1). `nodes` >= 1.
uint32_t NodeOfSample(uint32_t sample, uint64_t seed, uint32_t nodes);

// The samples of `ids` that node `node` of `nodes` serves. O(|ids|).
Roaring NodePart(const Roaring& ids, uint64_t seed, uint32_t node, uint32_t nodes);

// |NodePart(ids, seed, k, nodes)| for every k. O(|ids|).
std::vector<uint64_t> NodePartSizes(const Roaring& ids, uint64_t seed, uint32_t nodes);

// Global batches per epoch that every node of a job agrees on, so that every rank takes the same
// number of steps: with drop_last the smallest part's full batches (a larger part drops the rest
// of its epoch), else the largest part's batches, partial last one included (a smaller part pads
// its epoch with repeats). `global_batch` is the ranks of one node times their batch size.
uint64_t AgreedBatchesPerEpoch(const std::vector<uint64_t>& part_sizes, uint64_t global_batch,
                               bool drop_last);

}  // namespace carpool

#endif  // CARPOOL_SAMPLER_NODE_PARTITION_H_
