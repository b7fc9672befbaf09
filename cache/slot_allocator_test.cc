#include "cache/slot_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace carpool::cache {
namespace {

constexpr uint64_t kPage = 64 << 10;

TEST(SlotAllocatorTest, ClassesRoundUpByAtMostOneEighth) {
  SlotAllocator alloc(64 * kPage, kPage);
  for (uint64_t bytes : std::vector<uint64_t>{1, 128, 129, 1000, 4097, 50000, kPage - 1, kPage}) {
    uint64_t block = alloc.BlockBytes(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_EQ(block % SlotAllocator::kMinBlock, 0u);
    if (bytes > 1024) {
      EXPECT_LE(block, bytes + bytes / 8 + SlotAllocator::kMinBlock) << bytes;
    }
  }
  EXPECT_EQ(alloc.BlockBytes(kPage + 1), 2 * kPage);  // spans are whole pages
}

TEST(SlotAllocatorTest, BlocksDoNotOverlapAndStayInRange) {
  SlotAllocator alloc(16 * kPage, kPage);
  std::mt19937 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, bytes
  for (int i = 0; i < 400; ++i) {
    uint64_t bytes = 100 + rng() % (3 * kPage / 2);
    Result<SlotAllocator::Block> b = alloc.Allocate(bytes);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
      break;
    }
    EXPECT_GE(b->bytes, bytes);
    EXPECT_LE(b->offset + b->bytes, 16 * kPage);
    live.emplace_back(b->offset, b->bytes);
  }
  std::sort(live.begin(), live.end());
  for (size_t i = 1; i < live.size(); ++i) {
    EXPECT_LE(live[i - 1].first + live[i - 1].second, live[i].first) << i;
  }
}

TEST(SlotAllocatorTest, NewSlabsOnlyWhenNeededAndEmptyOnesGoBack) {
  SlotAllocator alloc(16 * kPage, kPage);
  Result<SlotAllocator::Block> a = alloc.Allocate(1000);
  ASSERT_TRUE(a.ok());
  const uint64_t slab_pages = alloc.stats().pages_in_use;
  EXPECT_GT(slab_pages, 0u);
  Result<SlotAllocator::Block> b = alloc.Allocate(1000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(alloc.stats().pages_in_use, slab_pages);  // same slab
  alloc.Free(a->offset);
  alloc.Free(b->offset);
  EXPECT_EQ(alloc.stats().pages_in_use, 0u);  // empty slab went back
  Result<SlotAllocator::Block> c = alloc.Allocate(2 * kPage + 5);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bytes, 3 * kPage);
  EXPECT_EQ(alloc.stats().pages_in_use, 3u);
}

// Random churn with a size mix that drifts over time. Bytes return to zero, and the allocator
// keeps serving requests while at most ~half full (no collapse into hoarding classes).
TEST(SlotAllocatorTest, ChurnReturnsEveryByteAndDoesNotCollapse) {
  constexpr uint64_t kTotal = 256 * kPage;  // 16 MiB
  SlotAllocator alloc(kTotal, kPage);
  std::mt19937 rng(1234);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, block bytes
  uint64_t live_bytes = 0;
  int failures_below_half = 0;
  for (int step = 0; step < 60000; ++step) {
    // Phase 0: small records; phase 1: ~200 KB images; phase 2: mixed up to 3 pages.
    int phase = (step / 10000) % 3;
    uint64_t bytes = phase == 0 ? 200 + rng() % 4000
                     : phase == 1 ? 190000 + rng() % 20000
                                  : 100 + rng() % (3 * kPage);
    bool grow = live_bytes < kTotal / 2 && rng() % 2 == 0;
    if (grow || live.empty()) {
      Result<SlotAllocator::Block> b = alloc.Allocate(bytes);
      if (b.ok()) {
        live.emplace_back(b->offset, b->bytes);
        live_bytes += b->bytes;
      } else if (live_bytes + bytes < kTotal / 2) {
        ++failures_below_half;
      }
    } else {
      size_t i = rng() % live.size();
      alloc.Free(live[i].first);
      live_bytes -= live[i].second;
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(alloc.stats().block_bytes, live_bytes);
  }
  EXPECT_EQ(failures_below_half, 0);
  for (auto [offset, bytes] : live) alloc.Free(offset);
  AllocatorStats st = alloc.stats();
  EXPECT_EQ(st.block_bytes, 0u);
  EXPECT_EQ(st.live_blocks, 0u);
  EXPECT_EQ(st.pages_in_use, 0u);
  EXPECT_EQ(st.largest_free_run_pages, 256u);  // everything coalesced back into one run
}

}  // namespace
}  // namespace carpool::cache
