#include "cache/sample_cache.h"

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace carpool::cache {
namespace {

std::string Instance(const char* tag) { return fmt::format("test-{}-{}", ::getpid(), tag); }

// Sample content that names its sample: bytes 0..3 hold the id, the rest derive from it.
void Fill(std::span<uint8_t> data, uint32_t sample) {
  std::memcpy(data.data(), &sample, std::min<size_t>(4, data.size()));
  for (size_t i = 4; i < data.size(); ++i) data[i] = static_cast<uint8_t>(sample * 131 + i * 7);
}
bool Matches(std::span<const uint8_t> data, uint32_t sample) {
  if (data.size() < 4 || std::memcmp(data.data(), &sample, 4) != 0) return false;
  for (size_t i = 4; i < data.size(); ++i) {
    if (data[i] != static_cast<uint8_t>(sample * 131 + i * 7)) return false;
  }
  return true;
}

std::unique_ptr<SampleCache> MakeCache(const char* tag, uint64_t capacity,
                                       EvictionPolicy policy = EvictionPolicy::kRefCnt) {
  CacheOptions o;
  o.instance = Instance(tag);
  o.capacity_bytes = capacity;
  o.policy = policy;
  Result<std::unique_ptr<SampleCache>> cache = SampleCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return cache.ok() ? std::move(*cache) : nullptr;
}

Result<SlotRef> Put(SampleCache& cache, uint32_t sample, uint64_t bytes) {
  Result<SampleCache::Allocation> a = cache.Allocate(sample, bytes);
  if (!a.ok()) return a.status();
  Fill(a->data, sample);
  return cache.Commit(sample);
}

TEST(SampleCacheTest, AllocateCommitLookupRead) {
  std::unique_ptr<SampleCache> cache = MakeCache("basic", 1 << 20);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->segment_name(), "carpool-" + Instance("basic"));
  Result<SampleCache::Allocation> a = cache->Allocate(7, 3000);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(cache->Pending(7));
  EXPECT_FALSE(cache->Lookup(7).has_value());  // pending: neither hit nor miss
  EXPECT_EQ(cache->Pin(7).code(), StatusCode::kFailedPrecondition) << "a pending slot: no pin";
  EXPECT_EQ(cache->Allocate(7, 3000).status().code(), StatusCode::kAlreadyExists);
  Fill(a->data, 7);
  Result<SlotRef> ref = cache->Commit(7);
  ASSERT_TRUE(ref.ok());
  std::optional<SlotRef> found = cache->Lookup(7);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, *ref);
  EXPECT_FALSE(cache->Lookup(8).has_value());

  ASSERT_TRUE(cache->Pin(7).ok());
  Result<std::span<const uint8_t>> pinned = cache->PinnedData(7);
  ASSERT_TRUE(pinned.ok());
  EXPECT_TRUE(Matches(*pinned, 7));
  ASSERT_TRUE(cache->Unpin(7).ok());
  EXPECT_EQ(cache->PinnedData(7).status().code(), StatusCode::kFailedPrecondition);

  CacheStats st = cache->Stats();
  EXPECT_EQ(st.index.hits, 1u);
  EXPECT_EQ(st.index.misses, 1u);
  EXPECT_EQ(st.index.entries, 1u);
  EXPECT_EQ(st.payload_bytes, 3000u);
  EXPECT_GE(st.index.bytes_used, 3000u + kSlotHeaderBytes);
}

TEST(SampleCacheTest, EvictionFollowsThePolicyAndKeepsEachSamplesBytes) {
  // 1 MiB cache of 64 KiB pages; 100 KB samples: about 9 fit.
  std::unique_ptr<SampleCache> cache = MakeCache("evict", 1 << 20);
  ASSERT_NE(cache, nullptr);
  for (uint32_t s = 0; s < 20; ++s) cache->SetRefCount(s, s < 10 ? 5 : 1);
  std::vector<SlotRef> refs;
  for (uint32_t s = 0; s < 20; ++s) {
    Result<SlotRef> ref = Put(*cache, s, 100000);
    ASSERT_TRUE(ref.ok()) << s << ": " << ref.status().ToString();
    refs.push_back(*ref);
  }
  // 100 KB samples take 2-page spans: 8 fit. refcnt evicted the oldest count-5 samples (0, 1, 2)
  // while nothing else was cached, then only count-1 samples (10..18), each by its successor.
  std::set<uint32_t> want = {3, 4, 5, 6, 7, 8, 9, 19};
  CacheStats st = cache->Stats();
  EXPECT_EQ(st.index.evictions, 12u);
  for (uint32_t s = 0; s < 20; ++s) {
    std::optional<SlotRef> found = cache->Lookup(s);
    ASSERT_EQ(found.has_value(), want.count(s) == 1) << s;
    if (!found) {
      EXPECT_EQ(cache->Pin(s).code(), StatusCode::kNotFound) << s;
      continue;
    }
    EXPECT_EQ(*found, refs[s]) << s;  // the slot and generation it was committed with
    ASSERT_TRUE(cache->Pin(s).ok());
    Result<std::span<const uint8_t>> data = cache->PinnedData(s);
    ASSERT_TRUE(data.ok()) << s;
    EXPECT_TRUE(Matches(*data, s)) << s;  // never another sample's bytes
    ASSERT_TRUE(cache->Unpin(s).ok());
  }
}

TEST(SampleCacheTest, PinnedSamplesSurviveAndFullPinsExhaust) {
  std::unique_ptr<SampleCache> cache = MakeCache("pins", 1 << 20, EvictionPolicy::kLru);
  ASSERT_NE(cache, nullptr);
  uint32_t s = 0;
  for (; s < 64; ++s) {
    Result<SlotRef> ref = Put(*cache, s, 100000);
    if (!ref.ok()) {
      EXPECT_EQ(ref.status().code(), StatusCode::kResourceExhausted) << ref.status().ToString();
      break;
    }
    ASSERT_TRUE(cache->Pin(s).ok());
  }
  ASSERT_LT(s, 64u);  // failed once everything was pinned
  CacheStats st = cache->Stats();
  EXPECT_EQ(st.index.evictions, 0u);
  EXPECT_EQ(st.index.bytes_pinned, st.index.bytes_used);
  ASSERT_TRUE(cache->Unpin(3).ok());
  ASSERT_TRUE(Put(*cache, 1000, 100000).ok());  // evicts 3, the only unpinned one
  EXPECT_FALSE(cache->Lookup(3).has_value());
  for (uint32_t p = 0; p < s; ++p) {
    if (p != 3) {
      EXPECT_TRUE(cache->Lookup(p).has_value()) << p;
    }
  }
  EXPECT_EQ(cache->Allocate(2000, 4 << 20).status().code(), StatusCode::kResourceExhausted);
}

TEST(SampleCacheTest, AbortReturnsTheSlot) {
  std::unique_ptr<SampleCache> cache = MakeCache("abort", 1 << 20);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Allocate(1, 5000).ok());
  ASSERT_TRUE(cache->Abort(1).ok());
  EXPECT_EQ(cache->Abort(1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache->Commit(1).status().code(), StatusCode::kNotFound);
  CacheStats st = cache->Stats();
  EXPECT_EQ(st.index.entries, 0u);
  EXPECT_EQ(st.index.bytes_used, 0u);
  EXPECT_EQ(st.allocator.block_bytes, 0u);
  EXPECT_EQ(st.payload_bytes, 0u);
}

TEST(SampleCacheTest, ZeroCapacityMeansNoCache) {
  std::unique_ptr<SampleCache> cache = MakeCache("zero", 0);
  ASSERT_NE(cache, nullptr);
  EXPECT_TRUE(cache->segment_name().empty());
  EXPECT_FALSE(cache->Lookup(1).has_value());
  EXPECT_EQ(cache->Allocate(1, 100).status().code(), StatusCode::kResourceExhausted);
  cache->AddRef(1, 2);
  EXPECT_EQ(cache->RefCount(1), 2u);
  EXPECT_EQ(cache->Stats().index.misses, 1u);
}

// The next-use policy ranks by the times SetNextUse stored: no oracle is called back.
TEST(SampleCacheTest, NextUseEvictsTheFurthestStoredUseFirst) {
  std::unique_ptr<SampleCache> cache = MakeCache("nextuse", 1 << 20, EvictionPolicy::kNextUse);
  ASSERT_NE(cache, nullptr);
  std::vector<uint32_t> evicted;
  uint32_t s = 0;
  for (; s < 64 && evicted.empty(); ++s) {
    cache->AddRef(s, 1);
    cache->AddDecided(s, +1);
    cache->SetNextUse(s, s == 3 ? 1e6 : 10.0 + s);  // sample 3 is needed last
    Result<SampleCache::Allocation> a = cache->Allocate(s, 100000, &evicted);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(cache->Commit(s).ok());
  }
  ASSERT_FALSE(evicted.empty()) << "the cache never filled";
  EXPECT_EQ(evicted.front(), 3u);
  // What the GPU's resident area reads: stored time from now, then undecided by count.
  cache->SetNextUse(5, std::numeric_limits<double>::infinity());
  cache->AddDecided(5, -1);
  cache->AddRef(5, 1);  // two jobs hold it, none has decided it
  const std::vector<uint32_t> ask = {4, 5, 999};
  std::vector<double> when(ask.size());
  cache->NextUses(ask, when);
  EXPECT_LE(when[0], 14.0);
  EXPECT_DOUBLE_EQ(when[1], SampleCache::kUndecidedSeconds / 2);
  EXPECT_TRUE(std::isinf(when[2])) << "no job holds it";
}

// Random churn through the facade with mixed sizes: accounting returns to zero.
TEST(SampleCacheTest, ChurnLeavesNoBytesBehind) {
  std::unique_ptr<SampleCache> cache = MakeCache("churn", 16 << 20, EvictionPolicy::kLru);
  ASSERT_NE(cache, nullptr);
  std::mt19937 rng(99);
  for (int i = 0; i < 5000; ++i) {
    uint32_t s = rng() % 3000;  // ~4x what fits
    if (cache->Lookup(s)) continue;
    uint64_t bytes = (i / 1000) % 2 == 0 ? 1000 + rng() % 60000 : 150000 + rng() % 100000;
    ASSERT_TRUE(Put(*cache, s, bytes).ok()) << i;
  }
  CacheStats st = cache->Stats();
  EXPECT_GT(st.index.evictions, 1000u);
  // Live slots fill most of the pages: fragmentation did not collapse the cache.
  EXPECT_GT(st.allocator.block_bytes, st.allocator.total_bytes / 2);
  for (uint32_t s = 0; s < 3000; ++s) cache->SetRefCount(s, 0);
  std::vector<uint32_t> cached;
  for (uint32_t s = 0; s < 3000; ++s) {
    if (cache->Lookup(s)) cached.push_back(s);
  }
  // Evict everything by allocating one sample as large as the whole cache, then abort it.
  uint64_t all = st.allocator.total_bytes - kSlotHeaderBytes;
  ASSERT_TRUE(cache->Allocate(4000, all).ok());
  ASSERT_TRUE(cache->Abort(4000).ok());
  st = cache->Stats();
  EXPECT_EQ(st.index.entries, 0u);
  EXPECT_EQ(st.index.bytes_used, 0u);
  EXPECT_EQ(st.allocator.block_bytes, 0u);
  EXPECT_EQ(st.allocator.pages_in_use, 0u);
  EXPECT_EQ(st.payload_bytes, 0u);
}

}  // namespace
}  // namespace carpool::cache
