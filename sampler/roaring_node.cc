#include "sampler/roaring_node.h"

#include <cassert>

namespace carpool {
namespace {

constexpr int kTries = 32;

// The element of rank `rank` in a 65536-bit bitset.
uint32_t BitsetSelect(const uint64_t* words, uint64_t rank) {
  for (uint32_t w = 0;; ++w) {
    const uint64_t count = static_cast<uint64_t>(__builtin_popcountll(words[w]));
    if (rank < count) {
      uint64_t word = words[w];
      for (uint64_t i = 0; i < rank; ++i) word &= word - 1;  // drop the lowest set bits
      return w * 64 + static_cast<uint32_t>(__builtin_ctzll(word));
    }
    rank -= count;
  }
}

}  // namespace

Roaring WithoutRuns(const Roaring& r) {
  Roaring out = r;
  roaring_array_t& ra = out.roaring.high_low_container;
  for (int32_t i = 0; i < ra.size; ++i) {
    if (ra.typecodes[i] != RUN_CONTAINER_TYPE_CODE) continue;
    auto* run = static_cast<run_container_t*>(ra.containers[i]);
    if (run_container_cardinality(run) > DEFAULT_MAX_SIZE) {
      ra.containers[i] = bitset_container_from_run(run);
      ra.typecodes[i] = BITSET_CONTAINER_TYPE_CODE;
    } else {
      ra.containers[i] = array_container_from_run(run);
      ra.typecodes[i] = ARRAY_CONTAINER_TYPE_CODE;
    }
    run_container_free(run);
  }
  return out;
}

uint32_t UniformElement(const Roaring& node, uint64_t size, Rng& rng) {
  const roaring_array_t& ra = node.roaring.high_low_container;
  uint64_t rank = rng.Uniform(size);
  int32_t i = 0;
  for (;; ++i) {
    assert(i < ra.size);
    const auto card =
        static_cast<uint64_t>(container_get_cardinality(ra.containers[i], ra.typecodes[i]));
    if (rank < card) break;
    rank -= card;
  }
  const uint32_t high = static_cast<uint32_t>(ra.keys[i]) << 16;
  switch (ra.typecodes[i]) {
    case ARRAY_CONTAINER_TYPE_CODE:
      return high | static_cast<const array_container_t*>(ra.containers[i])->array[rank];
    case BITSET_CONTAINER_TYPE_CODE: {
      const uint64_t* words = static_cast<const bitset_container_t*>(ra.containers[i])->array;
      for (int t = 0; t < kTries; ++t) {
        const auto x = static_cast<uint32_t>(rng.Uniform(65536));
        if ((words[x >> 6] >> (x & 63)) & 1) return high | x;
      }
      return high | BitsetSelect(words, rank);
    }
    default: {  // run or shared containers: the tree never makes them, but stay correct
      uint64_t before = 0;
      for (int32_t k = 0; k < i; ++k) {
        before +=
            static_cast<uint64_t>(container_get_cardinality(ra.containers[k], ra.typecodes[k]));
      }
      uint32_t element = 0;
      [[maybe_unused]] bool found = node.select(static_cast<uint32_t>(before + rank), &element);
      assert(found);
      return element;
    }
  }
}

}  // namespace carpool
