#include "server/sample_states.h"

#include <gtest/gtest.h>

#include <random>

namespace carpool {
namespace {

const PreparedShape kShape{8, 8, 3};

TEST(SampleStatesTest, TheLifeOfASample) {
  SampleStates s;
  EXPECT_EQ(s.Get(7), SampleState::kQueued);
  EXPECT_TRUE(s.NeedsPreparation(7));
  ASSERT_TRUE(s.BeginPreparation(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kPreparing);
  EXPECT_FALSE(s.NeedsPreparation(7));
  ASSERT_TRUE(s.Committed(7, kShape).ok());
  EXPECT_EQ(s.Get(7), SampleState::kCached);
  ASSERT_NE(s.Shape(7), nullptr);
  EXPECT_EQ(*s.Shape(7), kShape);
  ASSERT_TRUE(s.Evicted(7).ok());  // a pin found it gone
  EXPECT_EQ(s.Get(7), SampleState::kTransient);
  ASSERT_TRUE(s.TakeTransient(7).ok());  // a batch prepares it itself
  EXPECT_EQ(s.Get(7), SampleState::kQueued);
  EXPECT_NE(s.Shape(7), nullptr) << "the shape outlives the eviction";
  ASSERT_TRUE(s.LookupHit(7).ok());  // cached again from an earlier use
  EXPECT_EQ(s.Get(7), SampleState::kCached);
  ASSERT_TRUE(s.LookupMiss(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kQueued);
}

// An eviction the cache reports sends a needed sample back to the workers once per take: a second
// one before a batch takes it leaves it to its batch's assembler, so a cache smaller than the
// batches waiting on it cannot evict and re-prepare the same samples for ever.
TEST(SampleStatesTest, AnEvictedSampleInUseIsRequeuedOncePerTake) {
  SampleStates s;
  auto cache = [&](uint32_t id) {
    ASSERT_TRUE(s.BeginPreparation(id).ok());
    ASSERT_TRUE(s.Committed(id, kShape).ok());
  };
  cache(7);
  ASSERT_TRUE(s.EvictedInUse(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kQueued);
  EXPECT_TRUE(s.NeedsPreparation(7)) << "the workers prepare it again";
  cache(7);
  ASSERT_TRUE(s.EvictedInUse(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kTransient) << "evicted twice before a batch took it";
  ASSERT_TRUE(s.TakeTransient(7).ok());
  cache(7);
  ASSERT_TRUE(s.EvictedInUse(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kQueued) << "a transient take starts the count again";
  cache(7);
  s.Taken(7);  // pinned by a batch
  ASSERT_TRUE(s.EvictedInUse(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kQueued) << "a pinned take starts the count again";
  // Only a cached sample moves: one being prepared or already requeued is left alone.
  ASSERT_TRUE(s.BeginPreparation(7).ok());
  ASSERT_TRUE(s.EvictedInUse(7).ok());
  EXPECT_EQ(s.Get(7), SampleState::kPreparing);
  ASSERT_TRUE(s.EvictedInUse(8).ok());
  EXPECT_EQ(s.Get(8), SampleState::kQueued);
  EXPECT_FALSE(s.Has(8)) << "an unknown sample gets no entry";
}

TEST(SampleStatesTest, IllegalTransitionsChangeNothingAndNameTheStates) {
  SampleStates s;
  Status st = s.Committed(3, kShape);  // never prepared
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("sample 3: no transition from queued to cached"), std::string::npos)
      << st.message();
  EXPECT_EQ(s.Get(3), SampleState::kQueued);
  ASSERT_TRUE(s.BeginPreparation(3).ok());
  EXPECT_FALSE(s.BeginPreparation(3).ok()) << "prepared twice at once";
  EXPECT_FALSE(s.Evicted(3).ok());
  EXPECT_FALSE(s.TakeTransient(3).ok());
  EXPECT_FALSE(s.AlreadyCached(3).ok()) << "no shape was ever recorded";
  EXPECT_EQ(s.Get(3), SampleState::kPreparing);
  ASSERT_TRUE(s.NoRoom(3).ok());
  EXPECT_FALSE(s.LookupHit(3).ok()) << "a hit on a sample this server never committed";
  EXPECT_EQ(s.Get(3), SampleState::kTransient);
}

TEST(SampleStatesTest, LookupsLeavePreparingAndBadSamplesAlone) {
  SampleStates s;
  ASSERT_TRUE(s.BeginPreparation(1).ok());
  EXPECT_TRUE(s.LookupHit(1).ok());
  EXPECT_TRUE(s.LookupMiss(1).ok());
  EXPECT_EQ(s.Get(1), SampleState::kPreparing);
  EXPECT_TRUE(s.MarkBad(1, "not a JPEG"));
  EXPECT_FALSE(s.MarkBad(1, "again")) << "logged once";
  EXPECT_TRUE(s.LookupHit(1).ok());
  EXPECT_EQ(s.Get(1), SampleState::kBad);
  EXPECT_FALSE(s.BeginPreparation(1).ok()) << "bad is sticky";
  EXPECT_FALSE(s.NeedsPreparation(1));
}

TEST(SampleStatesTest, AbandonedAndAlreadyCachedPreparations) {
  SampleStates s;
  ASSERT_TRUE(s.BeginPreparation(4).ok());
  ASSERT_TRUE(s.Abandoned(4).ok());
  EXPECT_EQ(s.Get(4), SampleState::kQueued);
  ASSERT_TRUE(s.BeginPreparation(4).ok());
  ASSERT_TRUE(s.Committed(4, kShape).ok());
  ASSERT_TRUE(s.LookupMiss(4).ok());
  ASSERT_TRUE(s.BeginPreparation(4).ok());
  ASSERT_TRUE(s.AlreadyCached(4).ok()) << "committed before: its shape is known";
  EXPECT_EQ(s.Get(4), SampleState::kCached);
}

TEST(SampleStatesTest, ForgetDropsTheEntryButNotASampleBeingPrepared) {
  SampleStates s;
  ASSERT_TRUE(s.BeginPreparation(1).ok());
  ASSERT_TRUE(s.BeginPreparation(2).ok());
  ASSERT_TRUE(s.Committed(2, kShape).ok());
  EXPECT_TRUE(s.MarkBad(3, "corrupt"));
  EXPECT_EQ(s.size(), 3u);
  const Status refused = s.Forget(1);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("sample 1"), std::string::npos) << refused.ToString();
  EXPECT_EQ(s.Get(1), SampleState::kPreparing);
  ASSERT_TRUE(s.Forget(2).ok());
  ASSERT_TRUE(s.Forget(3).ok());
  ASSERT_TRUE(s.Forget(4).ok());  // never known: nothing to do
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s.Get(2), SampleState::kQueued);
  EXPECT_EQ(s.Shape(2), nullptr);
  EXPECT_EQ(s.Count(SampleState::kCached), 0u);
  EXPECT_EQ(s.Count(SampleState::kBad), 0u);
  EXPECT_TRUE(s.MarkBad(3, "tried again"));  // a forgotten bad sample is new again
}

// Random legal and illegal calls: the per-state counts always equal a recount of Get().
TEST(SampleStatesTest, CountsMatchTheStatesUnderRandomTransitions) {
  SampleStates s;
  std::mt19937 rng(11);
  constexpr uint32_t kSamples = 50;
  for (int step = 0; step < 20000; ++step) {
    const uint32_t id = rng() % kSamples;
    switch (rng() % 12) {
      case 0: (void)s.BeginPreparation(id); break;
      case 1: (void)s.Committed(id, kShape); break;
      case 2: (void)s.AlreadyCached(id); break;
      case 3: (void)s.NoRoom(id); break;
      case 4: (void)s.Evicted(id); break;
      case 5: (void)s.TakeTransient(id); break;
      case 6: (void)s.LookupHit(id); break;
      case 7: (void)s.LookupMiss(id); break;
      case 8: if (rng() % 50 == 0) (void)s.MarkBad(id, "x"); break;
      case 9: (void)s.Forget(id); break;
      case 10:
        (void)s.EvictedInUse(id);
        break;
      case 11:
        s.Taken(id);
        break;
    }
  }
  std::array<size_t, kSampleStateCount> recount{};
  for (uint32_t id = 0; id < kSamples; ++id) ++recount[static_cast<size_t>(s.Get(id))];
  for (size_t k = 1; k < kSampleStateCount; ++k) {
    EXPECT_EQ(s.Count(static_cast<SampleState>(k)), recount[k])
        << SampleStateName(static_cast<SampleState>(k));
  }
  EXPECT_LE(s.Count(SampleState::kQueued), recount[0]);
}

TEST(SampleStatesTest, AFaultedSampleIsBadWithItsReasonUntilForgotten) {
  SampleStates states;
  ASSERT_TRUE(states.BeginPreparation(5).ok());
  EXPECT_TRUE(states.MarkFaulted(5, "bad_alloc"));
  EXPECT_FALSE(states.MarkFaulted(5, "again"));  // the first reason stays
  EXPECT_EQ(states.Get(5), SampleState::kBad);
  ASSERT_NE(states.Fault(5), nullptr);
  EXPECT_EQ(*states.Fault(5), "bad_alloc");
  EXPECT_TRUE(states.MarkBad(6, "truncated JPEG"));
  EXPECT_EQ(states.Fault(6), nullptr);  // a data error is not a fault
  ASSERT_TRUE(states.Forget(5).ok());
  EXPECT_EQ(states.Fault(5), nullptr);
  EXPECT_EQ(states.Get(5), SampleState::kQueued);
  EXPECT_EQ(states.Count(SampleState::kBad), 1u);
}

}  // namespace
}  // namespace carpool
