// The bookkeeping of a GPU's device-resident sample area: which prepared samples sit where in a
// byte range of device memory, keyed by sample id (a prepared sample's bytes are a function of its
// id, so a resident copy stays valid after the host cache evicts the sample). Pure: no CUDA, so
// it is tested on every machine; server/gpu/gpu_service.cc maps offsets to device addresses.
//
// Space is carved in chunks, each for one size class (bytes rounded up to 256); a class without a
// free block carves a new chunk while the area has room, else evicts blocks of its own class in
// next-use order: among up to kCandidates sampled blocks not in use by the current batch, the
// furthest next use first (never used again = +inf first), a quarter of them at once.
// Thread-compatible.
#ifndef CARPOOL_SERVER_RESIDENT_AREA_H_
#define CARPOOL_SERVER_RESIDENT_AREA_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace carpool {

class ResidentArea {
 public:
  static constexpr uint64_t kAlign = 256;
  static constexpr uint64_t kDefaultChunkBytes = uint64_t{64} << 20;
  static constexpr size_t kCandidates = 64;
  using NextUseFn = std::function<void(std::span<const uint32_t>, std::span<double>)>;

  explicit ResidentArea(uint64_t capacity, uint64_t chunk_bytes = kDefaultChunkBytes);

  // The offset of `sample`'s resident copy, if it is resident with exactly `bytes`. O(1).
  std::optional<uint64_t> Find(uint32_t sample, uint64_t bytes) const;
  // Makes room for `sample` (not resident) and records it; returns its offset, or nullopt when
  // no block of its class can be had (every candidate is in `in_use`, or the area is too small).
  // The caller then copies the bytes there before anyone reads them. O(1) amortized, plus one
  // next_use call of up to kCandidates samples when it evicts.
  std::optional<uint64_t> Place(uint32_t sample, uint64_t bytes,
                                const std::unordered_set<uint32_t>& in_use,
                                const NextUseFn& next_use);
  // Forgets `sample` (e.g. its upload failed). O(1).
  void Erase(uint32_t sample);

  uint64_t capacity() const { return capacity_; }
  uint64_t resident_bytes() const { return resident_bytes_; }  // payload bytes of resident blocks
  uint64_t carved_bytes() const { return carved_; }
  size_t size() const { return where_.size(); }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Block {
    uint64_t offset = 0;
    uint32_t sample = 0;
  };
  struct SizeClass {
    std::vector<uint64_t> free;  // offsets of free blocks
    std::vector<Block> used;     // occupied blocks, any order (sampled for eviction)
  };
  struct Where {
    uint64_t block_bytes = 0;  // the class
    size_t used_index = 0;     // in its class's `used`
    uint64_t bytes = 0;        // payload
  };
  bool Carve(uint64_t block_bytes, SizeClass& cls);
  void EvictSome(SizeClass& cls, const std::unordered_set<uint32_t>& in_use,
                 const NextUseFn& next_use);
  void Remove(SizeClass& cls, size_t used_index);
  uint64_t NextRandom();

  uint64_t capacity_;
  uint64_t chunk_bytes_;
  uint64_t carved_ = 0;  // bytes handed to classes, from offset 0 up
  uint64_t resident_bytes_ = 0;
  uint64_t evictions_ = 0;
  uint64_t rng_ = 0x9e3779b97f4a7c15ULL;
  std::unordered_map<uint64_t, SizeClass> classes_;  // by block bytes
  std::unordered_map<uint32_t, Where> where_;        // by sample
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_RESIDENT_AREA_H_
