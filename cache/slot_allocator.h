// SlotAllocator: carves variable-size slots out of a byte range (the segment's data area) by size
// class. Its bookkeeping lives in the server's heap, never in shared memory, so readers cannot
// corrupt it and a crashed server leaves nothing to repair.
//
// The range is cut into pages. A size class (8 classes per doubling, so at most 12.5% rounding)
// takes a *slab* of 1..8 contiguous pages chosen to waste little at its end; a request larger than
// a page gets its own span of whole pages. A slab whose blocks are all free goes back to the page
// pool at once (best fit, coalescing), so pages move between classes when the mix of sizes moves:
// churn does not collapse into classes that hoard free memory.
// Thread-compatible: callers serialize access.
#ifndef CARPOOL_CACHE_SLOT_ALLOCATOR_H_
#define CARPOOL_CACHE_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "carpool/status.h"

namespace carpool::cache {

struct AllocatorStats {
  uint64_t total_bytes = 0;  // pages * page_bytes
  uint64_t block_bytes = 0;  // sum of live block sizes (requests rounded to their class or span)
  uint64_t pages_in_use = 0;     // pages held by slabs and spans
  uint64_t live_blocks = 0;
  uint64_t largest_free_run_pages = 0;
};

class SlotAllocator {
 public:
  static constexpr uint64_t kMinBlock = 128;   // also the block alignment
  static constexpr uint32_t kMaxSlabPages = 8;

  struct Block {
    uint64_t offset = 0;  // from the start of the range; a multiple of kMinBlock
    uint64_t bytes = 0;   // the block's size: the request rounded up to its class or span
  };

  // REQUIRES: page_bytes is a power of two >= 4096 and >= kMinBlock * 8.
  SlotAllocator(uint64_t total_bytes, uint64_t page_bytes);
  SlotAllocator(const SlotAllocator&) = delete;
  SlotAllocator& operator=(const SlotAllocator&) = delete;

  // ResourceExhausted when no block of that class and no run of pages is free.
  Result<Block> Allocate(uint64_t bytes);
  // REQUIRES: `offset` came from Allocate and was not freed since.
  void Free(uint64_t offset);

  // The block size Allocate(bytes) would return; for capacity checks before allocating.
  uint64_t BlockBytes(uint64_t bytes) const;
  AllocatorStats stats() const;
  uint64_t page_bytes() const { return page_bytes_; }
  uint32_t page_count() const { return page_count_; }

 private:
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kSpanClass = -1;
  struct SizeClass {
    uint64_t block_bytes = 0;
    uint32_t slab_pages = 0;
    uint32_t blocks_per_slab = 0;
    int32_t partial_head = kNone;  // slabs with a free block, doubly linked
  };
  struct Slab {
    uint32_t first_page = 0;
    uint32_t pages = 0;
    int32_t size_class = kSpanClass;
    uint32_t used = 0;
    uint32_t untouched = 0;        // blocks [untouched, blocks_per_slab) were never handed out
    std::vector<uint32_t> freed;   // block indices handed back
    int32_t prev = kNone, next = kNone;
  };

  int ClassOf(uint64_t bytes) const;  // -1: needs a span
  std::optional<uint32_t> TakeRun(uint32_t pages);
  void GiveRun(uint32_t first, uint32_t pages);
  int32_t NewSlab(uint32_t first_page, uint32_t pages, int32_t size_class);
  void ReleaseSlab(int32_t slab);
  void LinkPartial(int32_t slab);
  void UnlinkPartial(int32_t slab);

  uint64_t page_bytes_;
  uint32_t page_count_;
  std::vector<SizeClass> classes_;
  std::vector<Slab> slabs_;
  std::vector<int32_t> free_slabs_;
  std::vector<int32_t> slab_of_page_;
  std::map<uint32_t, uint32_t> runs_;                  // free runs: first page -> pages
  std::set<std::pair<uint32_t, uint32_t>> by_length_;  // (pages, first page), for best fit
  uint64_t block_bytes_ = 0;
  uint64_t pages_in_use_ = 0;
  uint64_t live_blocks_ = 0;
};

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_SLOT_ALLOCATOR_H_
