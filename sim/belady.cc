#include "sim/belady.h"

#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace carpool {

BeladyResult BeladyMin(std::span<const uint32_t> requests, uint64_t capacity) {
  const size_t n = requests.size();
  // next[i]: index of the next request of requests[i] after i, or n for never.
  std::vector<size_t> next(n);
  {
    std::unordered_map<uint32_t, size_t> seen;
    for (size_t i = n; i-- > 0;) {
      auto [it, fresh] = seen.try_emplace(requests[i], n);
      next[i] = it->second;
      it->second = i;
    }
  }
  BeladyResult result;
  // Cached samples keyed by the index of their next request (n for never, ties by id).
  std::set<std::pair<size_t, uint32_t>> cached;
  std::unordered_map<uint32_t, size_t> key_of;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t s = requests[i];
    auto hit = key_of.find(s);
    if (hit != key_of.end()) {
      cached.erase({hit->second, s});
      hit->second = next[i];
      cached.emplace(next[i], s);
      continue;
    }
    ++result.misses;
    if (capacity == 0) continue;
    if (cached.size() == capacity) {
      auto furthest = std::prev(cached.end());
      if (furthest->first <= next[i]) continue;  // bypass: the new sample is needed last
      key_of.erase(furthest->second);
      cached.erase(furthest);
      ++result.evictions;
    }
    cached.emplace(next[i], s);
    key_of.emplace(s, next[i]);
  }
  return result;
}

}  // namespace carpool
