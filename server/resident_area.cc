#include "server/resident_area.h"

#include <algorithm>
#include <numeric>

namespace carpool {

ResidentArea::ResidentArea(uint64_t capacity, uint64_t chunk_bytes)
    : capacity_(capacity / kAlign * kAlign),
      chunk_bytes_(std::max<uint64_t>(kAlign, chunk_bytes / kAlign * kAlign)) {}

std::optional<uint64_t> ResidentArea::Find(uint32_t sample, uint64_t bytes) const {
  auto it = where_.find(sample);
  if (it == where_.end() || it->second.bytes != bytes) return std::nullopt;
  const SizeClass& cls = classes_.at(it->second.block_bytes);
  return cls.used[it->second.used_index].offset;
}

uint64_t ResidentArea::NextRandom() {  // xorshift64: sampling candidates needs no quality
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  return rng_;
}

bool ResidentArea::Carve(uint64_t block_bytes, SizeClass& cls) {
  // A chunk holds at least one block; the last chunk may be smaller than chunk_bytes_.
  const uint64_t left = capacity_ - carved_;
  uint64_t chunk = std::min(std::max(chunk_bytes_, block_bytes), left);
  const uint64_t blocks = chunk / block_bytes;
  if (blocks == 0) return false;
  for (uint64_t b = blocks; b-- > 0;) cls.free.push_back(carved_ + b * block_bytes);
  carved_ += blocks * block_bytes;
  return true;
}

void ResidentArea::Remove(SizeClass& cls, size_t used_index) {
  const Block gone = cls.used[used_index];
  const Where& w = where_.at(gone.sample);
  resident_bytes_ -= w.bytes;
  if (used_index + 1 != cls.used.size()) {
    cls.used[used_index] = cls.used.back();
    where_.at(cls.used[used_index].sample).used_index = used_index;
  }
  cls.used.pop_back();
  cls.free.push_back(gone.offset);
  where_.erase(gone.sample);
}

void ResidentArea::EvictSome(SizeClass& cls, const std::unordered_set<uint32_t>& in_use,
                             const NextUseFn& next_use) {
  std::vector<uint32_t> candidates;
  const size_t n = cls.used.size();
  if (n <= kCandidates) {
    for (const Block& b : cls.used) {
      if (in_use.count(b.sample) == 0) candidates.push_back(b.sample);
    }
  } else {
    // Distinct random blocks; a few retries make up for ones in use.
    std::unordered_set<uint32_t> seen;
    for (size_t tries = 0; candidates.size() < kCandidates && tries < 4 * kCandidates; ++tries) {
      const Block& b = cls.used[NextRandom() % n];
      if (in_use.count(b.sample) == 0 && seen.insert(b.sample).second) {
        candidates.push_back(b.sample);
      }
    }
  }
  if (candidates.empty()) return;
  std::vector<double> when(candidates.size(), 0.0);
  if (next_use) next_use(candidates, when);
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return when[a] > when[b]; });
  const size_t evict = std::max<size_t>(1, candidates.size() / 4);
  for (size_t k = 0; k < evict; ++k) {
    Remove(cls, where_.at(candidates[order[k]]).used_index);
    ++evictions_;
  }
}

std::optional<uint64_t> ResidentArea::Place(uint32_t sample, uint64_t bytes,
                                            const std::unordered_set<uint32_t>& in_use,
                                            const NextUseFn& next_use) {
  if (bytes == 0 || where_.count(sample) != 0) return std::nullopt;
  const uint64_t block_bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (block_bytes > capacity_) return std::nullopt;
  SizeClass& cls = classes_[block_bytes];
  if (cls.free.empty() && !Carve(block_bytes, cls)) EvictSome(cls, in_use, next_use);
  if (cls.free.empty()) return std::nullopt;
  const uint64_t offset = cls.free.back();
  cls.free.pop_back();
  where_[sample] = Where{block_bytes, cls.used.size(), bytes};
  cls.used.push_back(Block{offset, sample});
  resident_bytes_ += bytes;
  return offset;
}

void ResidentArea::Erase(uint32_t sample) {
  auto it = where_.find(sample);
  if (it == where_.end()) return;
  Remove(classes_.at(it->second.block_bytes), it->second.used_index);
}

}  // namespace carpool
