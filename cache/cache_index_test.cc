#include "cache/cache_index.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace carpool::cache {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

class MapOracle : public NextUseOracle {
 public:
  double NextUse(uint32_t sample) const override {
    ++calls;
    auto it = next.find(sample);
    return it == next.end() ? kNever : it->second;
  }
  std::map<uint32_t, double> next;
  mutable int calls = 0;
};

CacheIndex::Options Opts(EvictionPolicy p, uint64_t capacity, size_t scan_limit = 0) {
  return CacheIndex::Options{p, capacity, scan_limit};
}

// Inserts samples with 1 byte each (the simulator's "capacity in samples").
void Fill(CacheIndex& index, const std::vector<uint32_t>& samples) {
  for (uint32_t s : samples) ASSERT_TRUE(index.Insert(s, s * 10, 1).ok()) << s;
}

// Evicts everything evictable and returns the order.
std::vector<uint32_t> DrainOrder(CacheIndex& index) {
  std::vector<uint32_t> order;
  while (auto v = index.PickVictim()) {
    order.push_back(*v);
    EXPECT_TRUE(index.Evict(*v).ok());
  }
  return order;
}

TEST(CacheIndexTest, ParsePolicyNames) {
  for (auto p : {EvictionPolicy::kRefCnt, EvictionPolicy::kNextUse, EvictionPolicy::kLru}) {
    Result<EvictionPolicy> parsed = ParseEvictionPolicy(EvictionPolicyName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  Result<EvictionPolicy> bad = ParseEvictionPolicy("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("refcnt, next-use, lru"), std::string::npos);
}

TEST(CacheIndexTest, RefCntEvictsLowestCountThenOldest) {
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 10));
  Fill(index, {5, 6, 7, 8, 9});
  index.SetRefCount(5, 3);
  index.SetRefCount(6, 1);
  index.SetRefCount(7, 0);
  index.SetRefCount(8, 1);
  index.SetRefCount(9, 0);
  // count 0: 7 (older), 9; count 1: 6, 8; count 3: 5.
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{7, 9, 6, 8, 5}));
}

TEST(CacheIndexTest, RefCntFollowsCountChangesWhileCached) {
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 10));
  index.AddRef(1, 2);
  index.AddRef(2, 2);
  Fill(index, {1, 2});
  EXPECT_EQ(index.PickVictim(), 1u);
  EXPECT_TRUE(index.AddRef(2, -1));
  EXPECT_EQ(index.PickVictim(), 2u);
  EXPECT_TRUE(index.AddRef(1, -2));
  EXPECT_EQ(index.PickVictim(), 1u);
  // Below zero is clamped and reported.
  EXPECT_FALSE(index.AddRef(1, -1));
  EXPECT_EQ(index.RefCount(1), 0u);
}

TEST(CacheIndexTest, RefCountsAreKeptForUncachedSamples) {
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 4));
  index.AddRef(1000000, 3);  // referenced before it is prepared
  EXPECT_EQ(index.RefCount(1000000), 3u);
  EXPECT_EQ(index.RefCount(999), 0u);
  Fill(index, {1000000, 1});
  EXPECT_EQ(index.PickVictim(), 1u);  // count 0 goes first
  ASSERT_TRUE(index.Evict(1000000).ok());
  EXPECT_EQ(index.RefCount(1000000), 3u);  // eviction does not forget the count
}

TEST(CacheIndexTest, NextUseEvictsFurthestAmongLowestCount) {
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 10), &oracle);
  Fill(index, {1, 2, 3, 4, 5});
  index.SetRefCount(1, 1);
  index.SetRefCount(2, 1);
  index.SetRefCount(3, 1);
  index.SetRefCount(4, 2);
  index.SetRefCount(5, 1);
  oracle.next = {{1, 5.0}, {2, 9.0}, {3, 1.0}, {4, 100.0}, {5, 9.0}};
  // Among count 1: furthest is 9.0 (samples 2 and 5; the older, 2, wins the tie).
  EXPECT_EQ(index.PickVictim(), 2u);
  oracle.next.erase(3);  // 3 is now only in R sets: never used by a decided queue
  EXPECT_EQ(index.PickVictim(), 3u);
  // Sample 4 has count 2, so it goes after all count-1 samples, though its use is furthest.
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{3, 2, 5, 1, 4}));
}

TEST(CacheIndexTest, NextUseScanStopsAtNeverAndAtLimit) {
  MapOracle oracle;
  {
    CacheIndex index(Opts(EvictionPolicy::kNextUse, 100), &oracle);
    Fill(index, {1, 2, 3, 4, 5, 6});
    oracle.next = {{1, 1.0}, {2, 2.0}};  // 3 is the first with no next use
    oracle.calls = 0;
    EXPECT_EQ(index.PickVictim(), 3u);
    EXPECT_EQ(oracle.calls, 3);
  }
  {
    CacheIndex index(Opts(EvictionPolicy::kNextUse, 100, /*scan_limit=*/2), &oracle);
    Fill(index, {1, 2, 3, 4, 5, 6});
    oracle.next = {{1, 1.0}, {2, 2.0}, {3, 3.0}, {4, 4.0}, {5, 5.0}, {6, 6.0}};
    oracle.calls = 0;
    EXPECT_EQ(index.PickVictim(), 2u);  // only the two oldest were asked
    EXPECT_EQ(oracle.calls, 2);
  }
}

TEST(CacheIndexTest, LruEvictsLeastRecentlyUsed) {
  CacheIndex index(Opts(EvictionPolicy::kLru, 10));
  Fill(index, {1, 2, 3, 4});
  index.SetRefCount(1, 5);  // counts do not matter to lru
  ASSERT_TRUE(index.Lookup(1).has_value());
  ASSERT_TRUE(index.Lookup(3).has_value());
  EXPECT_FALSE(index.Lookup(9).has_value());
  ASSERT_TRUE(index.Pin(2).ok());
  ASSERT_TRUE(index.Unpin(2).ok());  // unpinning counts as a use
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{4, 1, 3, 2}));
  IndexStats st = index.stats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.evictions, 4u);
  EXPECT_EQ(st.entries, 0u);
}

TEST(CacheIndexTest, PinnedEntriesAreNeverEvicted) {
  for (auto policy : {EvictionPolicy::kRefCnt, EvictionPolicy::kNextUse, EvictionPolicy::kLru}) {
    MapOracle oracle;
    CacheIndex index(Opts(policy, 3), &oracle);
    Fill(index, {1, 2, 3});
    ASSERT_TRUE(index.Pin(1).ok());
    ASSERT_TRUE(index.Pin(1).ok());  // nested
    ASSERT_TRUE(index.Pin(3).ok());
    EXPECT_EQ(index.stats().bytes_pinned, 2u);
    EXPECT_FALSE(index.Evict(1).ok());
    std::vector<CacheIndex::Evicted> evicted;
    ASSERT_TRUE(index.MakeRoom(1, &evicted).ok());
    ASSERT_EQ(evicted.size(), 1u);
    EXPECT_EQ(evicted[0].sample, 2u);
    ASSERT_TRUE(index.Insert(4, 40, 1).ok());
    ASSERT_TRUE(index.Pin(4).ok());
    // Everything is pinned: no victim, MakeRoom fails and evicts nothing.
    EXPECT_FALSE(index.PickVictim().has_value());
    Status full = index.MakeRoom(1, &evicted);
    EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << EvictionPolicyName(policy);
    EXPECT_EQ(index.stats().entries, 3u);
    ASSERT_TRUE(index.Unpin(1).ok());
    EXPECT_FALSE(index.PickVictim().has_value());  // still pinned once
    ASSERT_TRUE(index.Unpin(1).ok());
    EXPECT_EQ(index.PickVictim(), 1u);
    EXPECT_EQ(index.Unpin(1).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(index.Pin(77).code(), StatusCode::kNotFound);
  }
}

TEST(CacheIndexTest, CapacityInBytesAndZeroCapacity) {
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 100));
  ASSERT_TRUE(index.Insert(1, 0, 60).ok());
  EXPECT_EQ(index.Insert(2, 0, 50).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(index.Insert(1, 0, 10).code(), StatusCode::kAlreadyExists);
  std::vector<CacheIndex::Evicted> evicted;
  EXPECT_EQ(index.MakeRoom(101, &evicted).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(index.MakeRoom(50, &evicted).ok());
  ASSERT_TRUE(index.Insert(2, 0, 50).ok());
  EXPECT_EQ(index.stats().bytes_used, 50u);

  CacheIndex none(Opts(EvictionPolicy::kRefCnt, 0));
  EXPECT_FALSE(none.Lookup(1).has_value());
  EXPECT_EQ(none.Insert(1, 0, 1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(none.MakeRoom(1, &evicted).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(none.stats().misses, 1u);
}

// Differential test: refcnt against a from-scratch reference (min over (count, insertion order))
// under random inserts, count changes, pins and evictions.
TEST(CacheIndexTest, RefCntMatchesReferenceUnderRandomOperations) {
  std::mt19937 rng(42);
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 64));
  std::map<uint32_t, uint64_t> inserted_at;  // cached sample -> insertion number
  std::map<uint32_t, int> pins;
  std::vector<uint32_t> counts(200, 0);
  uint64_t clock = 0;
  for (int step = 0; step < 20000; ++step) {
    uint32_t s = rng() % 200;
    switch (rng() % 5) {
      case 0:
      case 1: {
        std::vector<CacheIndex::Evicted> evicted;
        if (inserted_at.count(s) || !index.MakeRoom(1, &evicted).ok()) break;
        for (auto& e : evicted) inserted_at.erase(e.sample);
        ASSERT_TRUE(index.Insert(s, 0, 1).ok());
        inserted_at[s] = clock++;
        break;
      }
      case 2: {
        int delta = static_cast<int>(rng() % 5) - 2;
        if (static_cast<int>(counts[s]) + delta < 0) delta = 0;
        counts[s] += delta;
        index.AddRef(s, delta);
        break;
      }
      case 3:
        if (inserted_at.count(s) && pins[s] < 2 && index.Pin(s).ok()) ++pins[s];
        break;
      case 4:
        if (pins[s] > 0 && index.Unpin(s).ok()) --pins[s];
        break;
    }
    std::optional<uint32_t> want;
    for (auto [sample, at] : inserted_at) {
      if (pins[sample] > 0) continue;
      if (!want || counts[sample] < counts[*want] ||
          (counts[sample] == counts[*want] && at < inserted_at[*want])) {
        want = sample;
      }
    }
    ASSERT_EQ(index.PickVictim(), want) << "step " << step;
  }
}

}  // namespace
}  // namespace carpool::cache
