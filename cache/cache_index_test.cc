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

// Differential: a bulk AddRefs (which rebuilds the eviction order when it touches many entries)
// leaves the same counts and evicts in the same order as AddRef one sample at a time.
TEST(CacheIndexTest, BulkAddRefsEvictsAsOneAtATime) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 20; ++trial) {
    CacheIndex bulk(Opts(EvictionPolicy::kRefCnt, 400)), single(Opts(EvictionPolicy::kRefCnt, 400));
    for (uint32_t s = 0; s < 300; ++s) {
      const uint32_t count = rng() % 4;
      bulk.SetRefCount(s, count);
      single.SetRefCount(s, count);
      if (s % 3 != 0) {
        ASSERT_TRUE(bulk.Insert(s, s, 1).ok());
        ASSERT_TRUE(single.Insert(s, s, 1).ok());
        if (s % 7 == 0) {
          ASSERT_TRUE(bulk.Pin(s).ok());
          ASSERT_TRUE(single.Pin(s).ok());
        }
      }
    }
    std::vector<uint32_t> ids;
    for (uint32_t s = 0; s < 300; ++s) {
      if (rng() % 2) ids.push_back(s);
    }
    const int64_t delta = trial % 2 ? 1 : -1;
    bulk.AddRefs(ids, delta);
    for (uint32_t s : ids) (void)single.AddRef(s, delta);
    for (uint32_t s = 0; s < 300; ++s) ASSERT_EQ(bulk.RefCount(s), single.RefCount(s)) << s;
    for (int k = 0; k < 150; ++k) {
      const std::optional<uint32_t> a = bulk.PickVictim(), b = single.PickVictim();
      ASSERT_EQ(a, b) << "trial " << trial << " eviction " << k;
      if (!a) break;
      ASSERT_TRUE(bulk.Evict(*a).ok());
      ASSERT_TRUE(single.Evict(*b).ok());
    }
  }
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

TEST(CacheIndexTest, NextUseEvictsFurthestAcrossCounts) {
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 10), &oracle);
  Fill(index, {1, 2, 3, 4, 5});
  index.SetRefCount(1, 1);
  index.SetRefCount(2, 1);
  index.SetRefCount(3, 1);
  index.SetRefCount(4, 2);
  index.SetRefCount(5, 1);
  oracle.next = {{1, 5.0}, {2, 9.0}, {3, 1.0}, {4, 100.0}, {5, 9.0}};
  // The count does not shelter sample 4: it is needed last.
  EXPECT_EQ(index.PickVictim(), 4u);
  oracle.next.erase(3);  // 3 is needed by no job any more (+infinity)
  EXPECT_EQ(index.PickVictim(), 3u);
  // 2 and 5 tie at 9.0 with equal counts: the older (2) goes first.
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{3, 4, 2, 5, 1}));
}

TEST(CacheIndexTest, NextUseKeepsAFastJobsSoonSampleOverASlowJobsFarOnes) {
  // Issue 4's "4 mixed": the fast job's own sample (count 1) is needed in 2 clock units; the
  // samples of two slow jobs (count 2) in 500. The old "lowest count first" evicted sample 1.
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 3), &oracle);
  Fill(index, {1, 2, 3});
  index.SetRefCount(1, 1);
  index.SetRefCount(2, 2);
  index.SetRefCount(3, 2);
  oracle.next = {{1, 2.0}, {2, 500.0}, {3, 400.0}};
  std::vector<CacheIndex::Evicted> evicted;
  ASSERT_TRUE(index.MakeRoom(1, &evicted).ok());
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].sample, 2u);
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{3, 1}));
}

TEST(CacheIndexTest, NextUseEvictsCountZeroThatNoJobNeedsFirst) {
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 10), &oracle);
  Fill(index, {1, 2, 3, 4});
  index.SetRefCount(1, 1);
  index.SetRefCount(2, 0);  // needed in a later epoch only: a finite next use
  index.SetRefCount(3, 3);
  index.SetRefCount(4, 0);  // needed by no job
  oracle.next = {{1, 1e9}, {2, 50.0}, {3, 1e12}, {4, 7.0}};
  // Count 0 and +infinity beats even a larger finite next use; the oracle says 4 is needed at
  // 7.0, so first make it "never".
  EXPECT_EQ(index.PickVictim(), 3u);
  oracle.next.erase(4);
  EXPECT_EQ(index.PickVictim(), 4u);
  ASSERT_TRUE(index.Evict(4).ok());
  // A count-0 sample with a next use (a later epoch) competes by next use like any other.
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{3, 1, 2}));

  // With K = 2 candidates out of 101, sampling alone would find the one unneeded sample about
  // 2% of the time; it is found every time.
  CacheIndex big(Opts(EvictionPolicy::kNextUse, 200, /*scan_limit=*/2), &oracle);
  oracle.next.clear();
  for (uint32_t s = 0; s < 101; ++s) {
    ASSERT_TRUE(big.Insert(s, 0, 1).ok());
    if (s == 60) continue;  // count 0, no next use
    big.SetRefCount(s, 1);
    oracle.next[s] = 1e6 + s;
  }
  EXPECT_EQ(big.PickVictim(), 60u);
}

TEST(CacheIndexTest, NextUseTiesGoToLowerCountThenOldest) {
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 10), &oracle);
  Fill(index, {1, 2, 3});
  index.SetRefCount(1, 2);
  index.SetRefCount(2, 1);
  index.SetRefCount(3, 1);
  oracle.next = {{1, 10.0}, {2, 10.0}, {3, 10.0}};
  EXPECT_EQ(DrainOrder(index), (std::vector<uint32_t>{2, 3, 1}));
}

// A sample some job has decided goes after every sample no queue holds, whatever the counts:
// refcnt by (decided, count, age); next-use never picks a decided one while undecided remain,
// even when its sampled candidates were all decided. decided_entries counts cached ones.
TEST(CacheIndexTest, DecidedSamplesAreEvictedLast) {
  CacheIndex refcnt(Opts(EvictionPolicy::kRefCnt, 10));
  Fill(refcnt, {1, 2, 3, 4});
  refcnt.SetRefCount(3, 4);   // in four jobs' R, decided by none
  refcnt.SetRefCount(1, 1);   // decided by one job
  ASSERT_TRUE(refcnt.AddDecided(1, +1));
  ASSERT_TRUE(refcnt.AddDecided(2, +1));
  ASSERT_TRUE(refcnt.AddDecided(9, +1));  // not cached: counted when inserted
  EXPECT_EQ(refcnt.stats().decided_entries, 2u);
  EXPECT_EQ(DrainOrder(refcnt), (std::vector<uint32_t>{4, 3, 2, 1}));
  EXPECT_EQ(refcnt.stats().decided_entries, 0u);
  EXPECT_FALSE(refcnt.AddDecided(5, -1)) << "below zero is clamped and reported";

  MapOracle oracle;
  CacheIndex nextuse(Opts(EvictionPolicy::kNextUse, 100, /*scan_limit=*/2), &oracle);
  Fill(nextuse, {1, 2, 3, 4, 5, 6});
  for (uint32_t s = 1; s <= 6; ++s) {
    nextuse.SetRefCount(s, 1);
    oracle.next[s] = 100.0 + s;  // decided ones needed latest: a plain next-use would take them
  }
  for (uint32_t s = 1; s <= 5; ++s) ASSERT_TRUE(nextuse.AddDecided(s, +1));
  oracle.next[6] = 1.0;
  EXPECT_EQ(nextuse.PickVictim(), 6u) << "6 is the only undecided entry";
}

TEST(CacheIndexTest, NextUseScanStopsAtNeverAndAtLimit) {
  MapOracle oracle;
  {
    CacheIndex index(Opts(EvictionPolicy::kNextUse, 100), &oracle);
    Fill(index, {1, 2, 3, 4, 5, 6});
    oracle.next = {{1, 1.0}, {2, 2.0}};  // count 0 everywhere; 3 is the first with no next use
    oracle.calls = 0;
    EXPECT_EQ(index.PickVictim(), 3u);
    EXPECT_EQ(oracle.calls, 3);
  }
  {
    // K = 2 of 6 entries with counts >= 1: two oracle calls per choice, and the victim is the
    // furthest of the two candidates.
    CacheIndex index(Opts(EvictionPolicy::kNextUse, 100, /*scan_limit=*/2), &oracle);
    Fill(index, {1, 2, 3, 4, 5, 6});
    for (uint32_t s = 1; s <= 6; ++s) {
      index.SetRefCount(s, 1);
      oracle.next[s] = s;
    }
    oracle.calls = 0;
    std::optional<uint32_t> victim = index.PickVictim();
    EXPECT_EQ(oracle.calls, 2);
    ASSERT_TRUE(victim.has_value());
    EXPECT_EQ(index.PickVictim(), victim) << "the same state picks the same victim";
  }
  {
    // Count-0 entries with finite next uses: K oldest of them, then K sampled: at most 2K calls.
    CacheIndex index(Opts(EvictionPolicy::kNextUse, 100, /*scan_limit=*/2), &oracle);
    Fill(index, {1, 2, 3, 4, 5, 6});
    oracle.calls = 0;
    ASSERT_TRUE(index.PickVictim().has_value());
    EXPECT_EQ(oracle.calls, 4);
  }
}

TEST(CacheIndexTest, NextUseSampledChoiceIsNearTheFurthest) {
  // 1000 entries with next use = id, K = 64 candidates per choice. A choice misses the top 10%
  // only if all 64 candidates do: 0.9^64 = 0.0012 (with replacement), so over 200 choices the
  // expected count is 0.24 and P(more than 3) < 1e-4.
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 1000), &oracle);
  for (uint32_t s = 0; s < 1000; ++s) {
    ASSERT_TRUE(index.Insert(s, 0, 1).ok());
    index.SetRefCount(s, 1);
    oracle.next[s] = s;
  }
  int below_top_decile = 0;
  std::set<uint32_t> victims;
  for (int round = 0; round < 200; ++round) {
    oracle.calls = 0;
    std::vector<CacheIndex::Evicted> evicted;
    ASSERT_TRUE(index.MakeRoom(1, &evicted).ok());
    ASSERT_EQ(evicted.size(), 1u);
    EXPECT_LE(oracle.calls, 64);
    const uint32_t v = evicted[0].sample;
    victims.insert(v);
    // Rank among the cached entries: how many have a later next use.
    int later = 0;
    for (auto [s, use] : oracle.next) later += use > oracle.next[v] && index.Find(s) != nullptr;
    below_top_decile += later >= 100;
    // Put it back, needed soonest now, so the furthest entries keep being the targets.
    oracle.next[v] = -1.0 - round;
    ASSERT_TRUE(index.Insert(v, 0, 1).ok());
    index.SetRefCount(v, 1);
  }
  EXPECT_LE(below_top_decile, 3);
  EXPECT_GT(victims.size(), 150u) << "the candidates change from one choice to the next";
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

// A second prepare spec's keys start at 1 << 27 (server/prepared_keys.h). The per-key arrays
// follow the keys in use: before, a dense array grew to the largest key (1.6 GB for three of
// them, server RSS 54 MB -> 2.4 GB when a 40-sample dataset of a second spec joined).
TEST(CacheIndexTest, PerKeyMemoryFollowsTheKeysInUseNotTheLargestKey) {
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 1000));
  const uint32_t second_spec = uint32_t{1} << 27;
  for (uint32_t id = 0; id < 40; ++id) {
    ASSERT_TRUE(index.AddRef(id, 1));
    ASSERT_TRUE(index.AddRef(second_spec + id, 2));
  }
  ASSERT_TRUE(index.Insert(second_spec + 3, 0, 10).ok());
  EXPECT_EQ(index.RefCount(second_spec + 3), 2u);
  EXPECT_EQ(index.RefCount(7), 1u);
  EXPECT_EQ(index.RefCount(second_spec + 100000), 0u) << "an untouched key reads as 0";
  EXPECT_LE(index.per_key_bytes(), size_t{2} * 3 * 65536 * 4) << "two pages per array";
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

// What a differential test knows about the index, kept from scratch.
struct Model {
  std::map<uint32_t, uint64_t> inserted_at;  // cached sample -> insertion number
  std::map<uint32_t, int> pins;
  std::vector<uint32_t> counts;
  MapOracle* oracle = nullptr;  // next-use only
  double Use(uint32_t s) const {
    auto it = oracle->next.find(s);
    return it == oracle->next.end() ? kNever : it->second;
  }
};

// Random inserts (through MakeRoom), count changes, pins, unpins and, with an oracle, next-use
// changes (on a coarse grid, so ties happen; sometimes "never"). After every step the index's
// victim must be the unpinned entry that no other beats by `better(model, a, b)`.
void CheckVictimsAgainstModel(CacheIndex& index, Model& model, uint32_t ids, uint32_t seed,
                              bool (*better)(const Model&, uint32_t, uint32_t)) {
  std::mt19937 rng(seed);
  model.counts.assign(ids, 0);
  uint64_t clock = 0;
  for (int step = 0; step < 20000; ++step) {
    uint32_t s = rng() % ids;
    switch (rng() % (model.oracle != nullptr ? 6 : 5)) {
      case 0:
      case 1: {
        std::vector<CacheIndex::Evicted> evicted;
        if (model.inserted_at.count(s) || !index.MakeRoom(1, &evicted).ok()) break;
        for (auto& e : evicted) model.inserted_at.erase(e.sample);
        ASSERT_TRUE(index.Insert(s, 0, 1).ok());
        model.inserted_at[s] = clock++;
        break;
      }
      case 2: {
        int delta = static_cast<int>(rng() % 5) - 2;
        if (static_cast<int>(model.counts[s]) + delta < 0) delta = 0;
        model.counts[s] += delta;
        index.AddRef(s, delta);
        break;
      }
      case 3:
        if (model.inserted_at.count(s) && model.pins[s] < 2 && index.Pin(s).ok()) ++model.pins[s];
        break;
      case 4:
        if (model.pins[s] > 0 && index.Unpin(s).ok()) --model.pins[s];
        break;
      case 5:
        if (rng() % 4 == 0) {
          model.oracle->next.erase(s);
        } else {
          model.oracle->next[s] = static_cast<double>(rng() % 8);
        }
        break;
    }
    std::optional<uint32_t> want;
    for (auto [sample, at] : model.inserted_at) {
      if (model.pins[sample] > 0) continue;
      if (!want || better(model, sample, *want)) want = sample;
    }
    ASSERT_EQ(index.PickVictim(), want) << "step " << step;
  }
}

// refcnt: min over (count, insertion order).
TEST(CacheIndexTest, RefCntMatchesReferenceUnderRandomOperations) {
  CacheIndex index(Opts(EvictionPolicy::kRefCnt, 64));
  Model model;
  CheckVictimsAgainstModel(index, model, 200, 42, [](const Model& m, uint32_t a, uint32_t b) {
    if (m.counts[a] != m.counts[b]) return m.counts[a] < m.counts[b];
    return m.inserted_at.at(a) < m.inserted_at.at(b);
  });
}

// next-use with an unbounded scan: count 0 and never needed first (oldest), else the furthest
// next use, ties by lower count, then older.
TEST(CacheIndexTest, NextUseUnboundedMatchesReferenceUnderRandomOperations) {
  MapOracle oracle;
  CacheIndex index(Opts(EvictionPolicy::kNextUse, 48, CacheIndex::kUnboundedScan), &oracle);
  Model model;
  model.oracle = &oracle;
  CheckVictimsAgainstModel(index, model, 150, 7, [](const Model& m, uint32_t a, uint32_t b) {
    const bool a_dead = m.counts[a] == 0 && std::isinf(m.Use(a));
    const bool b_dead = m.counts[b] == 0 && std::isinf(m.Use(b));
    if (a_dead != b_dead) return a_dead;
    if (!a_dead && m.Use(a) != m.Use(b)) return m.Use(a) > m.Use(b);
    if (!a_dead && m.counts[a] != m.counts[b]) return m.counts[a] < m.counts[b];
    return m.inserted_at.at(a) < m.inserted_at.at(b);
  });
}

}  // namespace
}  // namespace carpool::cache
