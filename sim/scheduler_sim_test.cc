#include "sim/scheduler_sim.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace carpool {
namespace {

using cache::EvictionPolicy;

Roaring Range(uint32_t lo, uint32_t hi) {
  Roaring r;
  r.addRange(lo, hi);
  return r;
}

SchedulerSimOptions Opts(uint64_t cache, EvictionPolicy policy, uint64_t lookahead) {
  SchedulerSimOptions o;
  o.cache_samples = cache;
  o.policy = policy;
  o.lookahead = lookahead;
  o.seed = 11;
  return o;
}

std::vector<SimJobSpec> TwoJobs(double fast, double slow, uint32_t epochs) {
  return {{"a", Range(0, 400), 0, fast, epochs}, {"b", Range(100, 500), 20, slow, epochs}};
}

TEST(SchedulerSimTest, NoCacheMeansEveryDeliveryIsAPreparation) {
  auto r = RunSchedulerSim(TwoJobs(1, 0.5, 2), Opts(0, EvictionPolicy::kRefCnt, 64));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->deliveries, 2u * 400 + 2u * 400);
  EXPECT_EQ(r->preparations, r->deliveries);
  EXPECT_EQ(r->belady_preparations, r->deliveries);
  EXPECT_EQ(r->hits, 0u);
  for (const auto& j : r->jobs) {
    EXPECT_EQ(j.deliveries, 800u) << j.name;
    EXPECT_EQ(j.epochs, 2u) << j.name;
  }
}

TEST(SchedulerSimTest, IdenticalJobsShareEverySample) {
  std::vector<SimJobSpec> jobs = {{"a", Range(0, 300), 0, 1, 1}, {"b", Range(0, 300), 0, 1, 1}};
  auto r = RunSchedulerSim(jobs, Opts(2, EvictionPolicy::kLru, 8));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->deliveries, 600u);
  EXPECT_EQ(r->shared_deliveries, 600u) << "identical R's share every round";
  EXPECT_EQ(r->preparations, 300u) << "the second job always hits";
  EXPECT_EQ(r->belady_preparations, 300u);
  EXPECT_EQ(r->ticks, 300u) << "speed 1: one delivery per tick";
}

TEST(SchedulerSimTest, FractionalSpeedsAccumulate) {
  std::vector<SimJobSpec> jobs = {{"slow", Range(0, 100), 5, 0.25, 1}};
  auto r = RunSchedulerSim(jobs, Opts(10, EvictionPolicy::kRefCnt, 16));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->jobs[0].deliveries, 100u);
  EXPECT_EQ(r->jobs[0].finish_tick, 5u + 399u) << "one delivery every 4 ticks from tick 5";
}

TEST(SchedulerSimTest, BeladyIsALowerBoundOnTheSameRequests) {
  for (uint64_t cache : {4u, 20u, 80u, 400u}) {
    for (uint64_t lookahead : {8u, 128u}) {
      std::vector<SampleId> first;
      for (EvictionPolicy p :
           {EvictionPolicy::kRefCnt, EvictionPolicy::kNextUse, EvictionPolicy::kLru}) {
        SchedulerSimOptions o = Opts(cache, p, lookahead);
        o.keep_requests = true;
        auto r = RunSchedulerSim(TwoJobs(2, 0.5, 2), o);
        ASSERT_TRUE(r.ok());
        EXPECT_LE(r->belady_preparations, r->preparations) << cache << " " << lookahead;
        EXPECT_EQ(r->hits + r->preparations, r->deliveries);
        EXPECT_GE(r->preparations, 500u) << "every distinct sample is prepared at least once";
        if (first.empty()) {
          first = r->requests;
        } else {
          EXPECT_EQ(r->requests, first) << "the cache does not change the decisions";
        }
      }
    }
  }
}

TEST(SchedulerSimTest, FullCachePreparesEachSampleOnce) {
  auto r = RunSchedulerSim(TwoJobs(1, 0.25, 3), Opts(500, EvictionPolicy::kNextUse, 64));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->preparations, 500u);
  EXPECT_EQ(r->evictions, 0u);
}

// Issue 4's "4 mixed" at a tenth of the size: a fast job `c` owns ids no other job needs, the
// slow jobs `b` and `d` keep counts of 2-3 on samples they need much later. Ranking by count
// first (the old next-use) evicted `c`'s soon-needed samples (1.14-1.22 x Belady at full size).
TEST(SchedulerSimTest, NextUseStaysNearBeladyWithAFastJobOnItsOwnIds) {
  const std::vector<SimJobSpec> jobs = {{"a", Range(0, 400), 0, 1, 2},
                                        {"b", Range(0, 400), 0, 0.5, 2},
                                        {"c", Range(200, 600), 40, 2, 2},
                                        {"d", Range(0, 200), 80, 0.25, 2}};
  for (uint64_t cache : {20u, 80u, 400u}) {
    auto nu = RunSchedulerSim(jobs, Opts(cache, EvictionPolicy::kNextUse, 64));
    auto rc = RunSchedulerSim(jobs, Opts(cache, EvictionPolicy::kRefCnt, 64));
    ASSERT_TRUE(nu.ok() && rc.ok());
    EXPECT_LE(nu->preparations, rc->preparations) << "cache " << cache;
    EXPECT_LE(static_cast<double>(nu->preparations),
              1.10 * static_cast<double>(nu->belady_preparations))
        << "cache " << cache << ": " << nu->preparations << " vs Belady "
        << nu->belady_preparations;
  }
}

TEST(SchedulerSimTest, DeliveriesAreReportedInOrder) {
  std::map<size_t, std::vector<uint32_t>> epochs;
  uint64_t last_tick = 0, count = 0;
  auto r = RunSchedulerSim(TwoJobs(1, 0.5, 2), Opts(40, EvictionPolicy::kRefCnt, 32),
                           [&](const SimDelivery& d) {
                             EXPECT_GE(d.tick, last_tick);
                             last_tick = d.tick;
                             ++count;
                             auto& e = epochs[d.job];
                             if (e.empty() || e.back() != d.epoch) e.push_back(d.epoch);
                           });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(count, r->deliveries);
  EXPECT_EQ(epochs[0], (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(epochs[1], (std::vector<uint32_t>{0, 1}));
}

TEST(SchedulerSimTest, RejectsBadInput) {
  SchedulerSimOptions o = Opts(10, EvictionPolicy::kLru, 8);
  EXPECT_FALSE(RunSchedulerSim({}, o).ok());
  EXPECT_FALSE(RunSchedulerSim({{"a", Range(0, 10), 0, 0, 1}}, o).ok());
  EXPECT_FALSE(RunSchedulerSim({{"a", Range(0, 10), -1, 1, 1}}, o).ok());
  EXPECT_FALSE(RunSchedulerSim({{"a", Roaring(), 0, 1, 1}}, o).ok());
  EXPECT_FALSE(RunSchedulerSim({{"a", Range(0, 10), 0, 1, 0}}, o).ok());
  o.prefetch = 0;
  EXPECT_FALSE(RunSchedulerSim({{"a", Range(0, 10), 0, 1, 1}}, o).ok());
  o.prefetch = 4;
  o.lookahead = 0;  // derived
  EXPECT_TRUE(RunSchedulerSim({{"a", Range(0, 10), 0, 1, 1}}, o).ok());
}

// The timing flags: each bad value is named in the message with what to use instead.
TEST(SchedulerSimTest, RejectsBadTimingOptionsNamingTheValueAndTheFix) {
  const std::vector<SimJobSpec> jobs = {{"a", Range(0, 10), 0, 1, 1}};
  struct Case {
    SchedulerSimOptions options;
    std::string value;  // as the message must show it
    std::string fix;
  };
  std::vector<Case> cases;
  for (double bad : {-0.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    SchedulerSimOptions o = Opts(10, EvictionPolicy::kNextUse, 0);
    o.jitter = bad;
    cases.push_back({o, fmt::format("--jitter {}", bad), "use 0 for exact speeds"});
    o = Opts(10, EvictionPolicy::kNextUse, 0);
    o.prep_capacity = bad;
    cases.push_back({o, fmt::format("--prep-capacity {}", bad), "use 0 for unlimited"});
  }
  SchedulerSimOptions o = Opts(10, EvictionPolicy::kNextUse, 0);
  o.jitter = 0.3;
  o.jitter_period = 0;
  cases.push_back({o, "--jitter-period 0", "use 1"});
  o = Opts(10, EvictionPolicy::kNextUse, 16);
  o.batch = 32;
  cases.push_back({o, "--batch 32 exceeds --lookahead 16", "--lookahead 0 (derived)"});
  for (const Case& c : cases) {
    const Status s = ValidateSchedulerSim(jobs, c.options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.value;
    EXPECT_NE(s.message().find(c.value), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.fix), std::string::npos) << s.message();
    EXPECT_FALSE(RunSchedulerSim(jobs, c.options).ok()) << c.value;
  }
  EXPECT_EQ(ValidateSchedulerSim(jobs, Opts(10, EvictionPolicy::kNextUse, 0)).code(),
            StatusCode::kOk);
}

// Timing options for four jobs of one dataset whose clients slow down and speed up for 50 ticks
// at a time, on a server that prepares 1.2 samples per tick: enough for the jobs together (one
// preparation serves all four), not for a job whose samples the others' were evicted for.
SchedulerSimOptions DriftingJobs(uint64_t seed, bool pacing) {
  SchedulerSimOptions o = Opts(50, EvictionPolicy::kNextUse, 0);  // 5% of the dataset
  o.seed = seed;
  o.jitter = 0.5;
  o.jitter_period = 50;
  o.prep_capacity = 1.2;
  o.batch = 32;
  o.pacing = pacing;
  return o;
}

std::vector<SimJobSpec> FourIdenticalJobs(uint32_t n, uint32_t epochs) {
  std::vector<SimJobSpec> jobs;
  for (const char* name : {"a", "b", "c", "d"}) jobs.push_back({name, Range(0, n), 0, 1, epochs});
  return jobs;
}

// The collapse the pacing exists for: without it the jobs drift apart, the laggers' samples are
// evicted before they get there and the server, busy preparing them again, falls behind (about
// half a preparation per delivery where one preparation should serve four). With it the leader
// waits and sharing stays near the Belady bound of the same deliveries, and the jobs finish
// sooner. Fails on a scheduler whose pacing does not hold.
TEST(SchedulerSimTest, PacingKeepsDriftingJobsSharingASmallCache) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto off = RunSchedulerSim(FourIdenticalJobs(1000, 2), DriftingJobs(seed, false));
    auto on = RunSchedulerSim(FourIdenticalJobs(1000, 2), DriftingJobs(seed, true));
    ASSERT_TRUE(off.ok() && on.ok()) << seed;
    const double off_ratio = double(off->preparations) / double(off->deliveries);
    const double on_ratio = double(on->preparations) / double(on->deliveries);
    EXPECT_GT(off_ratio, 0.45) << "seed " << seed << ": the drift no longer costs without pacing";
    EXPECT_LE(on_ratio, 0.35) << "seed " << seed << ": pacing off " << off_ratio;
    EXPECT_LE(on_ratio, 1.25 * double(on->belady_preparations) / double(on->deliveries)) << seed;
    EXPECT_LT(on->ticks, off->ticks) << seed;
    EXPECT_GT(on->holds, 0u) << seed;
    uint64_t held = 0;
    for (const auto& j : off->jobs) held += j.held_ticks;
    EXPECT_EQ(held, 0u) << "pacing off never holds";
  }
}

// With i.i.d. per-tick jitter the same jobs do not drift far: one preparation keeps serving all
// four, with and without pacing, as long as the server keeps up with one job.
TEST(SchedulerSimTest, PerTickJitterKeepsIdenticalJobsTogether) {
  for (bool pacing : {false, true}) {
    SchedulerSimOptions o = DriftingJobs(1, pacing);
    o.cache_samples = 100;
    o.jitter = 0.3;
    o.jitter_period = 1;
    o.prep_capacity = 2;
    o.batch = 0;
    auto r = RunSchedulerSim(FourIdenticalJobs(1000, 2), o);
    ASSERT_TRUE(r.ok());
    EXPECT_LE(double(r->preparations), 1.05 * double(r->belady_preparations)) << pacing;
    EXPECT_EQ(r->hits + r->preparations - r->prepared_ahead, r->deliveries);
  }
}

// 1:2 speeds: the slower job waits on its own client, so the lift lets the faster one go; it
// finishes in about half the ticks instead of being held to the slower one's pace.
TEST(SchedulerSimTest, LiftLetsAFasterJobGoWhenTheSlowerIsClientBound) {
  for (double capacity : {0.0, 2.5}) {
    SchedulerSimOptions o = Opts(100, EvictionPolicy::kNextUse, 0);
    o.jitter = 0.3;
    o.prep_capacity = capacity;
    const std::vector<SimJobSpec> jobs = {{"slow", Range(0, 1000), 0, 1, 2},
                                          {"fast", Range(0, 1000), 0, 2, 2}};
    auto r = RunSchedulerSim(jobs, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto& slow = r->jobs[0];
    const auto& fast = r->jobs[1];
    EXPECT_LT(double(fast.finish_tick), 0.6 * double(slow.finish_tick)) << capacity;
    EXPECT_LT(fast.held_ticks, fast.finish_tick / 20) << capacity;
    EXPECT_GT(r->lifts, 0u) << capacity;
  }
}

// Each job delivers each sample of its dataset exactly once per epoch, whatever holds it back:
// jitter, a preparation capacity that starves it, batches split over ticks, the pacing.
TEST(SchedulerSimTest, EveryEpochDeliversEachSampleOnceUnderPacingAndCapacity) {
  const std::vector<SimJobSpec> jobs = {{"a", Range(0, 600), 0, 1, 2},
                                        {"b", Range(0, 600), 0, 1.5, 3},
                                        {"c", Range(300, 900), 40, 0.5, 2},
                                        {"d", Range(0, 600), 100, 1, 1}};
  for (uint64_t batch : {0u, 8u}) {
    for (uint64_t period : {1u, 30u}) {
      SchedulerSimOptions o = Opts(60, EvictionPolicy::kNextUse, 0);
      o.jitter = 0.5;
      o.jitter_period = period;
      o.prep_capacity = 1.5;
      o.batch = batch;
      std::map<std::pair<size_t, uint32_t>, std::vector<uint32_t>> seen;  // (job, epoch) -> ids
      std::map<std::pair<size_t, uint64_t>, uint64_t> per_tick;           // (job, tick) -> count
      auto r = RunSchedulerSim(jobs, o, [&](const SimDelivery& d) {
        seen[{d.job, d.epoch}].push_back(d.sample);
        ++per_tick[{d.job, d.tick}];
      });
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      for (size_t j = 0; j < jobs.size(); ++j) {
        EXPECT_EQ(r->jobs[j].epochs, jobs[j].epochs);
        for (uint32_t e = 0; e < jobs[j].epochs; ++e) {
          std::vector<uint32_t> ids = seen[{j, e}];
          std::sort(ids.begin(), ids.end());
          std::vector<uint32_t> want(jobs[j].dataset.begin(), jobs[j].dataset.end());
          EXPECT_EQ(ids, want) << "job " << jobs[j].name << " epoch " << e << " batch " << batch;
        }
      }
      // A starved job keeps at most two batches of credit: it never bursts beyond that.
      for (const auto& [key, count] : per_tick) {
        const double batch_size = double(std::max<uint64_t>(batch, 1));
        EXPECT_LE(double(count), 2 * std::max(batch_size, jobs[key.first].speed))
            << jobs[key.first].name << " tick " << key.second;
      }
      EXPECT_LE(double(r->preparations), 1.5 * double(r->ticks) + 1) << "capacity per tick";
      EXPECT_EQ(r->hits + r->preparations - r->prepared_ahead, r->deliveries);
    }
  }
}

TEST(SchedulerSimTest, JitterIsDeterministicForASeed) {
  SchedulerSimOptions o = DriftingJobs(7, true);
  o.keep_requests = true;
  auto a = RunSchedulerSim(FourIdenticalJobs(300, 1), o);
  auto b = RunSchedulerSim(FourIdenticalJobs(300, 1), o);
  o.seed = 8;
  auto c = RunSchedulerSim(FourIdenticalJobs(300, 1), o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->requests, b->requests);
  EXPECT_EQ(a->ticks, b->ticks);
  EXPECT_NE(a->requests, c->requests);
}

// A batch is taken whole: with an unlimited capacity a job's deliveries come B at a time, in
// the tick it is owed a batch (the last batch of an epoch may be short).
TEST(SchedulerSimTest, BatchesAreTakenWhole) {
  SchedulerSimOptions o = Opts(100, EvictionPolicy::kNextUse, 0);
  o.batch = 10;
  const std::vector<SimJobSpec> jobs = {{"a", Range(0, 205), 0, 1, 2},
                                        {"b", Range(0, 205), 0, 3, 1}};
  std::map<std::pair<size_t, uint64_t>, uint64_t> per_tick;
  auto r = RunSchedulerSim(jobs, o, [&](const SimDelivery& d) { ++per_tick[{d.job, d.tick}]; });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  uint64_t short_batches = 0;
  for (const auto& [key, count] : per_tick) {
    if (count % 10 != 0) ++short_batches;
  }
  EXPECT_LE(short_batches, 3u) << "one short batch per epoch end (205 = 20 x 10 + 5)";
  EXPECT_EQ(r->jobs[0].deliveries, 410u);
  EXPECT_EQ(r->jobs[1].deliveries, 205u);
}

}  // namespace
}  // namespace carpool
