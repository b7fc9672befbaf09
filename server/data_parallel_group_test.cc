// DataParallelGroup and its RankSource: a group joins as one participant once every rank is
// there, splits each global batch into equal slices (padding the epoch's last one), gives every
// rank the same number of batches, ends every rank together, and fails every rank when one
// leaves early, one asks for something else, or they do not all come in time.
#include "server/data_parallel_group.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "server/engine_job.h"

namespace carpool {
namespace {

struct RecordingSink : JobSink {
  void DeliverBatch(const protocol::BatchReady&) override {}
  void DeliverEndOfData(uint32_t) override { ++ends; }
  void DeliverError(const Status& status) override { errors.push_back(status); }
  int ends = 0;
  std::vector<Status> errors;
};

struct Rank {
  EngineJob job;
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
};

std::vector<std::unique_ptr<Rank>> Ranks(uint32_t world, uint32_t batch) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    auto rank = std::make_unique<Rank>();
    protocol::CreateJob& q = rank->job.request;
    // Copied from strings, not assigned from literals: GCC 12 at -O3 warns falsely (-Wrestrict)
    // on operator=(const char*) here.
    static const std::string kKey("sweep-7"), kDataset("d");
    q.job_key = kKey;
    q.dataset = kDataset;
    q.world_size = world;
    q.rank = r;
    q.batch_size = batch;
    q.epochs = 1;
    q.prefetch = 2;
    rank->job.id = 10 + r;
    rank->job.sink = rank->sink;
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

Roaring Ids(uint32_t n) {
  Roaring ids;
  ids.addRange(0, n);
  return ids;
}

TEST(DataParallelGroupTest, EveryRankGetsEqualSlicesAndTheSameNumberOfBatches) {
  Scheduler scheduler(SchedulerOptions{}, nullptr);
  auto ranks = Ranks(2, 3);  // global batch 6 over 11 samples: 2 batches, the last padded by 1
  DataParallelGroup group(scheduler, ranks[0]->job, /*batches_per_epoch=*/2, 0);
  ASSERT_TRUE(group.Join(ranks[0]->job).ok());
  EXPECT_FALSE(group.complete());
  EXPECT_EQ(ranks[0]->job.source->participant(), 0u) << "no participant before every rank is in";
  ASSERT_TRUE(group.Join(ranks[1]->job).ok());
  ASSERT_TRUE(group.complete());
  ASSERT_TRUE(group.Start(ranks[1]->job, 100, Ids(11), false, 0).ok());
  EXPECT_EQ(ranks[0]->job.source->participant(), 100u);
  std::map<uint32_t, int> seen;
  std::vector<int> batches(2, 0);
  double now = 0;
  for (int step = 0; step < 20; ++step) {
    scheduler.Tick(now += 1);
    for (uint32_t r = 0; r < 2; ++r) {
      BatchSource& source = *ranks[r]->job.source;
      std::vector<Decision> slice;
      if (source.Next(&slice, now) != BatchSource::Front::kBatch) continue;
      source.Taken(0);
      EXPECT_EQ(slice.size(), 3u) << "equal slices, padding included";
      for (const Decision& d : slice) ++seen[d.sample];
      ++batches[r];
    }
    for (uint32_t r = 0; r < 2; ++r) ranks[r]->job.source->Consumed(3, now);
    for (uint32_t r = 0; r < 2; ++r) ranks[r]->job.source->FinishIfDone();
  }
  EXPECT_EQ(batches[0], 2);
  EXPECT_EQ(batches[1], 2);
  EXPECT_EQ(seen.size(), 11u) << "every sample of the epoch";
  int repeats = 0;
  for (const auto& [sample, n] : seen) repeats += n - 1;
  EXPECT_EQ(repeats, 1) << "one padding entry";
  JobSnapshot snapshot;
  ranks[1]->job.source->Describe(snapshot);
  EXPECT_EQ(snapshot.job_key, "sweep-7");
  EXPECT_EQ(snapshot.rank, 1u);
  EXPECT_EQ(snapshot.world_size, 2u);
  EXPECT_EQ(snapshot.padded, 1u);
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]->sink->ends, 1) << "rank " << r;
    EXPECT_TRUE(ranks[r]->job.done);
  }
  EXPECT_FALSE(scheduler.Contains(100)) << "the participant leaves once every rank has ended";
}

TEST(DataParallelGroupTest, ARankLeavingEarlyFailsTheOthersAndTheLastTakesTheGroup) {
  Scheduler scheduler(SchedulerOptions{}, nullptr);
  auto ranks = Ranks(3, 2);
  DataParallelGroup group(scheduler, ranks[0]->job, 2, 0);
  for (auto& r : ranks) ASSERT_TRUE(group.Join(r->job).ok());
  ASSERT_TRUE(group.Start(ranks[2]->job, 5, Ids(12), false, 0).ok());
  EXPECT_FALSE(ranks[1]->job.source->Leave()) << "two ranks are left";
  for (uint32_t r : {0u, 2u}) {
    ASSERT_EQ(ranks[r]->sink->errors.size(), 1u);
    const Status& e = ranks[r]->sink->errors[0];
    EXPECT_EQ(e.code(), StatusCode::kUnavailable);
    EXPECT_NE(e.message().find("rank 1 of data-parallel job \"sweep-7\""), std::string::npos)
        << e.message();
  }
  EXPECT_TRUE(ranks[1]->sink->errors.empty()) << "the one that left hears nothing";
  EXPECT_FALSE(scheduler.Contains(5)) << "a failed group's decisions go at once";
  EXPECT_FALSE(ranks[0]->job.source->Leave());
  EXPECT_TRUE(ranks[2]->job.source->Leave()) << "the last rank out takes the group";
  EXPECT_EQ(group.Join(ranks[1]->job).code(), StatusCode::kFailedPrecondition);
}

TEST(DataParallelGroupTest, JoinRefusesAMismatchATwiceJoinedRankAndMissingRanksInTime) {
  Scheduler scheduler(SchedulerOptions{}, nullptr);
  auto ranks = Ranks(3, 4);
  DataParallelGroup group(scheduler, ranks[0]->job, 1, /*now=*/0);
  ASSERT_TRUE(group.Join(ranks[0]->job).ok());
  EXPECT_EQ(group.Join(ranks[0]->job).code(), StatusCode::kAlreadyExists);
  ranks[1]->job.request.batch_size = 8;
  const Status mismatch = group.Join(ranks[1]->job);
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("batch_size 8 (the job's first rank said 4)"),
            std::string::npos)
      << mismatch.message();
  group.CheckJoined(/*now=*/30, /*timeout=*/60);
  EXPECT_TRUE(ranks[0]->sink->errors.empty()) << "still in time";
  group.CheckJoined(61, 60);
  ASSERT_EQ(ranks[0]->sink->errors.size(), 1u);
  EXPECT_EQ(ranks[0]->sink->errors[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(ranks[0]->sink->errors[0].message().find("missing: 1, 2"), std::string::npos)
      << ranks[0]->sink->errors[0].message();
}

}  // namespace
}  // namespace carpool
