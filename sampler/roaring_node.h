// Two operations on roaring bitmaps that the sampling tree needs and CRoaring 0.2.66 lacks or
// gets wrong. This is the only code that reads CRoaring's containers directly.
#ifndef CARPOOL_SAMPLER_ROARING_NODE_H_
#define CARPOOL_SAMPLER_ROARING_NODE_H_

#include <cstdint>
#include <roaring/roaring.hh>

#include "sampler/rng.h"

namespace carpool {

// A copy of `r` without run containers (arrays and bitsets only). Removing random elements from a
// run container splits its runs and makes removal and select linear in the runs. CRoaring
// 0.2.66's removeRunCompression writes past the arrays it allocates (valgrind: invalid write in
// convert_to_bitset_or_array_container), so this converts each run container itself.
Roaring WithoutRuns(const Roaring& r);

// One element of `node`, exactly uniformly at random. A container is chosen with probability
// card/size; in a bitset container (density > 1/16) up to kTries uniform positions are tried, and
// if all miss, the element of a uniform rank is taken; an array container is indexed directly.
// Each branch is uniform, so the mixture is. REQUIRES: size == node.cardinality() > 0.
uint32_t UniformElement(const Roaring& node, uint64_t size, Rng& rng);

}  // namespace carpool

#endif  // CARPOOL_SAMPLER_ROARING_NODE_H_
