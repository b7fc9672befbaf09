// SampleLifecycle: a key keeps its state exactly while a job uses it, a worker prepares it, it is
// bad from its data, or the cache may still hold it (an orphan); checked case by case, and after
// random churn against a reference model (the conservation law of docs/architecture.md).
#include "server/sample_lifecycle.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace carpool {
namespace {

// Image files `ids` under folder /data, one block (a dataset as one load brought it).
DatasetSamples Files(std::vector<uint32_t> ids) {
  DatasetSamples d;
  d.block = std::make_shared<SampleBlock>();
  d.block->records.files = {"/data"};
  for (uint32_t id : ids) {
    SampleRecords::Row row;
    row.id = id;
    row.kind = SampleRecords::Kind::kFile;
    d.block->records.rows.push_back(row);
    d.info.ids.add(id);
  }
  d.block->released.reset(new std::atomic<bool>[ids.size()]());
  return d;
}

struct Fixture {
  std::set<uint32_t> cached;  // what the fake cache holds
  SampleLifecycle life{[this](uint32_t key) { return cached.count(key) > 0; }};

  void Acquire(const DatasetSamples& d) { ASSERT_TRUE(life.Acquire(d, 0, d.size()).ok()); }
  void Release(const DatasetSamples& d) {
    std::vector<uint32_t> keys(d.info.ids.begin(), d.info.ids.end());
    life.Release(keys);
  }
  // A worker prepares `key` into the cache.
  void Prepare(uint32_t key) {
    ASSERT_TRUE(life.states().BeginPreparation(key).ok());
    ASSERT_TRUE(life.states().Committed(key, PreparedShape{2, 2, 3}).ok());
    cached.insert(key);
    ASSERT_TRUE(life.Settle(key).ok());
  }
};

TEST(SampleLifecycleTest, AKeyNoJobUsesKeepsItsStateOnlyWhileTheCacheHoldsIt) {
  Fixture f;
  const DatasetSamples a = Files({1, 2});
  f.Acquire(a);
  f.Prepare(1);
  f.Release(a);
  EXPECT_TRUE(f.life.states().Has(1)) << "the cache still holds it: an orphan";
  EXPECT_EQ(f.life.orphans(), 1u);
  EXPECT_FALSE(f.life.states().Has(2));
  f.cached.erase(1);  // evicted without a word
  f.life.Sweep(0);
  EXPECT_FALSE(f.life.states().Has(1));
  EXPECT_EQ(f.life.orphans(), 0u);
  EXPECT_TRUE(f.life.CheckInvariants().ok());
}

TEST(SampleLifecycleTest, AnOrphanUsedAgainKeepsItsShapeAndStopsBeingAnOrphan) {
  Fixture f;
  const DatasetSamples a = Files({5});
  f.Acquire(a);
  f.Prepare(5);
  f.Release(a);
  ASSERT_EQ(f.life.orphans(), 1u);
  f.Acquire(a);  // a later job on the same samples
  EXPECT_EQ(f.life.orphans(), 0u);
  ASSERT_NE(f.life.states().Shape(5), nullptr) << "its cache hit needs the shape";
  EXPECT_TRUE(f.life.CheckInvariants().ok());
}

TEST(SampleLifecycleTest, APreparingKeyStaysUntilItsWorkerSettlesIt) {
  Fixture f;
  const DatasetSamples a = Files({3});
  f.Acquire(a);
  ASSERT_TRUE(f.life.states().BeginPreparation(3).ok());
  f.Release(a);  // the last job leaves mid-preparation
  EXPECT_TRUE(f.life.states().Has(3));
  ASSERT_TRUE(f.life.states().NoRoom(3).ok());  // the worker reports back
  ASSERT_TRUE(f.life.Settle(3).ok());
  EXPECT_FALSE(f.life.states().Has(3));
  EXPECT_TRUE(f.life.CheckInvariants().ok());
}

TEST(SampleLifecycleTest, DataBadKeysStayBadAndFaultedOnesAreForgotten) {
  Fixture f;
  const DatasetSamples a = Files({1, 2});
  f.Acquire(a);
  f.life.states().MarkBad(1, "truncated JPEG");
  f.life.states().MarkFaulted(2, "std::bad_alloc");
  f.Release(a);
  EXPECT_EQ(f.life.states().Get(1), SampleState::kBad) << "a damaged file stays skipped";
  EXPECT_FALSE(f.life.states().Has(2)) << "a fault is tried again by a later job";
  EXPECT_TRUE(f.life.CheckInvariants().ok());
}

TEST(SampleLifecycleTest, CheckInvariantsNamesAStrayState) {
  Fixture f;
  ASSERT_TRUE(f.life.states().BeginPreparation(9).ok());
  ASSERT_TRUE(f.life.states().NoRoom(9).ok());  // transient, yet no job uses it
  const Status s = f.life.CheckInvariants();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sample key 9"), std::string::npos) << s.ToString();
}

// Random jobs join and leave over overlapping key ranges while workers prepare and the cache
// evicts; after every step the invariant holds, and at the end, with every job gone and the cache
// empty, only data-bad keys keep a state (nothing leaks over days of sweeps).
TEST(SampleLifecycleTest, ChurnConservesStatesAgainstAReferenceModel) {
  Fixture f;
  std::mt19937 rng(7);
  std::map<int, DatasetSamples> jobs;
  std::map<uint32_t, int> users;  // reference: key -> jobs using it
  std::set<uint32_t> bad;
  int next_job = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 2 || jobs.empty()) {  // a job joins: 20 keys from [0, 120)
      const uint32_t first = std::uniform_int_distribution<uint32_t>(0, 100)(rng);
      std::vector<uint32_t> ids;
      for (uint32_t k = first; k < first + 20; ++k) ids.push_back(k);
      jobs.emplace(next_job, Files(ids));
      f.Acquire(jobs.at(next_job++));
      for (uint32_t k : ids) ++users[k];
    } else if (op < 4) {  // a job leaves
      auto it = std::next(jobs.begin(), std::uniform_int_distribution<size_t>(0, jobs.size() - 1)(rng));
      f.Release(it->second);
      for (uint32_t k : it->second.info.ids) --users[k];
      jobs.erase(it);
    } else if (op < 8) {  // a worker prepares a used key
      const uint32_t k = std::uniform_int_distribution<uint32_t>(0, 119)(rng);
      if (users[k] == 0 || !f.life.states().NeedsPreparation(k)) continue;
      if (op == 7 && rng() % 8 == 0) {
        ASSERT_TRUE(f.life.states().BeginPreparation(k).ok());
        f.life.states().MarkBad(k, "corrupt");
        bad.insert(k);
        ASSERT_TRUE(f.life.Settle(k).ok());
      } else {
        f.Prepare(k);
      }
    } else {  // the cache evicts one key, telling only sometimes (Allocate's evicted list)
      if (f.cached.empty()) continue;
      auto it = std::next(f.cached.begin(),
                          std::uniform_int_distribution<size_t>(0, f.cached.size() - 1)(rng));
      const uint32_t k = *it;
      f.cached.erase(it);
      if (op == 8) {
        ASSERT_TRUE(f.life.Evicted(k).ok());
        // A key still in use is not left listed as cached (its batch would find it gone).
        if (f.life.InUse(k)) {
          ASSERT_NE(f.life.states().Get(k), SampleState::kCached);
        }
      }
    }
    f.life.Sweep(step * 0.01);
    const Status invariants = f.life.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants.ToString();
    size_t in_use = 0;
    for (const auto& [k, n] : users) in_use += n > 0 ? 1 : 0;
    ASSERT_EQ(f.life.keys_in_use(), in_use) << "step " << step;
  }
  for (auto& [id, d] : jobs) f.Release(d);
  f.cached.clear();
  for (int i = 0; i < 3; ++i) f.life.Sweep(1e6 * (i + 1));
  EXPECT_EQ(f.life.keys_in_use(), 0u);
  EXPECT_EQ(f.life.orphans(), 0u);
  EXPECT_EQ(f.life.states().size(), bad.size()) << "only data-bad keys keep a state";
}

}  // namespace
}  // namespace carpool
