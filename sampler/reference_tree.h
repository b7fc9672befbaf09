// Test-only reference for the sampling tree: explicit std::set R's, and the nodes recomputed
// from scratch with the definitions of docs/architecture.md "The sampling tree and a DSA round"
// (not the suffix-intersection identity the tree uses):
//   N_p = (R_p ∩ … ∩ R_n) \ (N_1 ∪ … ∪ N_{p-1}),   L_p = R_p \ (N_1 ∪ … ∪ N_p).
// Thread-compatible.
#ifndef CARPOOL_SAMPLER_REFERENCE_TREE_H_
#define CARPOOL_SAMPLER_REFERENCE_TREE_H_

#include <algorithm>
#include <iterator>
#include <map>
#include <roaring/roaring.hh>
#include <set>
#include <vector>

#include "sampler/sampling_tree.h"

namespace carpool::testing {

using SampleSet = std::set<SampleId>;

inline SampleSet ToSet(const Roaring& r) {
  SampleSet s;
  for (uint32_t x : r) s.insert(x);
  return s;
}

struct ReferenceNodes {
  std::vector<JobId> order;  // ascending by |R|, then id
  std::vector<SampleSet> spine;
  std::vector<SampleSet> leaf;
};

inline ReferenceNodes ComputeReferenceNodes(const std::map<JobId, SampleSet>& r) {
  ReferenceNodes out;
  for (const auto& [id, set] : r) out.order.push_back(id);
  std::stable_sort(out.order.begin(), out.order.end(), [&](JobId a, JobId b) {
    return r.at(a).size() != r.at(b).size() ? r.at(a).size() < r.at(b).size() : a < b;
  });
  const size_t n = out.order.size();
  SampleSet earlier;  // N_1 ∪ … ∪ N_{p-1}
  for (size_t p = 0; p < n; ++p) {
    SampleSet inter = r.at(out.order[p]);
    for (size_t q = p + 1; q < n; ++q) {
      SampleSet next;
      const SampleSet& other = r.at(out.order[q]);
      std::set_intersection(inter.begin(), inter.end(), other.begin(), other.end(),
                            std::inserter(next, next.end()));
      inter = std::move(next);
    }
    SampleSet node;
    std::set_difference(inter.begin(), inter.end(), earlier.begin(), earlier.end(),
                        std::inserter(node, node.end()));
    earlier.insert(node.begin(), node.end());
    SampleSet leaf;
    const SampleSet& mine = r.at(out.order[p]);
    std::set_difference(mine.begin(), mine.end(), earlier.begin(), earlier.end(),
                        std::inserter(leaf, leaf.end()));
    out.spine.push_back(std::move(node));
    out.leaf.push_back(std::move(leaf));
  }
  return out;
}

}  // namespace carpool::testing

#endif  // CARPOOL_SAMPLER_REFERENCE_TREE_H_
