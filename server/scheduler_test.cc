#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/sample_cache.h"

namespace carpool {
namespace {

// Keeps the counts the scheduler reports, to compare with a from-scratch recount.
class CountingSink : public RefCountSink {
 public:
  void AddRef(SampleId sample, int64_t delta) override {
    int64_t& c = counts[sample];
    c += delta;
    ASSERT_GE(c, 0) << "sample " << sample << " went negative";
    if (c == 0) counts.erase(sample);
  }
  void AddDecided(SampleId sample, int64_t delta) override {
    int64_t& c = decided[sample];
    c += delta;
    ASSERT_GE(c, 0) << "sample " << sample << " decided count went negative";
    if (c == 0) decided.erase(sample);
  }
  std::map<SampleId, int64_t> counts;
  std::map<SampleId, int64_t> decided;  // AddDecided: queue entries per sample
};

// (jobs whose R holds the sample) + (queue entries holding it), from the scheduler's state.
std::map<SampleId, int64_t> Recount(const Scheduler& s) {
  std::map<SampleId, int64_t> counts;
  for (JobId j : s.Jobs()) {
    for (uint32_t x : *s.tree().RemainingSet(j)) ++counts[x];
    for (const Decision& d : *s.Queue(j)) ++counts[d.sample];
  }
  return counts;
}

Roaring Range(uint32_t lo, uint32_t hi) {
  Roaring r;
  r.addRange(lo, hi);
  return r;
}

SchedulerOptions Opts(uint64_t lookahead, uint64_t seed = 7) {
  SchedulerOptions o;
  o.seed = seed;
  o.lookahead = lookahead;
  return o;
}

// Adds a job over ids of [lo, lo + width) for a random lo below `spread`, each kept unless a
// 1-in-`drop` draw leaves it out, with random epochs and prefetch. True when AddJob succeeds.
// One step of a random churn: the clock moves a quarter, then which kind of step (0-9) and the
// jobs present.
std::pair<int, std::vector<JobId>> NextChurnStep(std::mt19937_64& gen, const Scheduler& s,
                                                 double& now) {
  now += 0.25;
  return {static_cast<int>(gen() % 10), s.Jobs()};
}

bool AddRandomJob(Scheduler& s, std::mt19937_64& gen, JobId id, uint32_t spread, uint32_t width,
                  uint32_t drop, double now) {
  Roaring ds;
  const uint32_t lo = static_cast<uint32_t>(gen() % spread);
  for (uint32_t x = lo; x < lo + width; ++x) {
    if (gen() % drop != 0) ds.add(x);
  }
  if (ds.isEmpty()) ds.add(lo);
  return s.AddJob(id, ds, 1 + gen() % 3, 1 + gen() % 8, now).ok();
}

// Following on in half the trials (followers' steps, rewinds at joins, leaders leaving).
TEST(SchedulerTest, RefCountsMatchRecountUnderRandomOperations) {
  std::mt19937_64 gen(42);
  uint64_t followed = 0;
  for (int trial = 0; trial < 40; ++trial) {
    CountingSink sink;
    const uint64_t lookahead = 1 + gen() % 24;
    SchedulerOptions options = Opts(lookahead, trial);
    options.follow = trial % 2 == 0;
    Scheduler s(options, &sink);
    JobId next_id = 1;
    double now = 0;
    for (int op = 0; op < 300; ++op) {
      const auto [kind, jobs] = NextChurnStep(gen, s, now);
      if (kind == 0 || jobs.empty()) {
        ASSERT_TRUE(AddRandomJob(s, gen, next_id++, 60, 40, 3, now));
        const uint64_t keep = gen() % 4;  // the others give back all but `keep` of their queues
        std::map<JobId, std::vector<Decision>> fronts;  // what the engine may be building
        for (JobId j : s.Jobs()) {
          const auto& q = *s.Queue(j);
          fronts[j].assign(q.begin(), q.begin() + static_cast<ptrdiff_t>(std::min<size_t>(
                                                     keep, q.size())));
        }
        s.UndecideTails(next_id - 1, [keep](JobId) { return keep; });
        for (auto& [j, front] : fronts) {
          const auto& q = *s.Queue(j);
          ASSERT_GE(q.size(), front.size()) << "job " << j << " lost part of its kept front";
          ASSERT_TRUE(std::equal(front.begin(), front.end(), q.begin())) << "job " << j;
        }
      } else if (kind == 1) {
        ASSERT_TRUE(s.RemoveJob(jobs[gen() % jobs.size()]).ok());
      } else if (kind < 5) {
        s.Tick(now);
      } else {
        JobId j = jobs[gen() % jobs.size()];
        size_t n = std::min<size_t>(s.Queue(j)->size(), gen() % 5);
        ASSERT_TRUE(s.Consume(j, n, now).ok());
        if (s.Finished(j)) {
          ASSERT_TRUE(s.RemoveJob(j).ok());
        }
      }
      ASSERT_EQ(sink.counts, Recount(s)) << "trial " << trial << " op " << op;
      for (JobId j : s.Jobs()) ASSERT_LE(s.Queue(j)->size(), lookahead);
    }
    followed += s.followed();
    for (JobId j : s.Jobs()) ASSERT_TRUE(s.RemoveJob(j).ok());
    EXPECT_TRUE(sink.counts.empty()) << "removing every job must release every reference";
  }
  EXPECT_GT(followed, 100u) << "the churn must exercise followers";
}

// Queue entries per sample, from the scheduler's state.
std::map<SampleId, int64_t> RecountDecided(const Scheduler& s) {
  std::map<SampleId, int64_t> counts;
  for (JobId j : s.Jobs()) {
    for (const Decision& d : *s.Queue(j)) ++counts[d.sample];
  }
  return counts;
}

// The pacing's bookkeeping after churn, against a model kept beside it: a sample is owed from
// the delivery that leaves it in another queue until no queue holds it; a job is behind by its
// queue entries of owed samples. The decided counts the sink sees equal the queue entries.
TEST(SchedulerTest, PacingBookkeepingMatchesAModelUnderRandomOperations) {
  std::mt19937_64 gen(4242);
  for (int trial = 0; trial < 20; ++trial) {
    CountingSink sink;
    Scheduler s(Opts(1 + gen() % 24, trial), &sink);
    s.SetCapacity(1 + gen() % 16);
    std::set<SampleId> owed;
    JobId next_id = 1;
    double now = 0;
    for (int op = 0; op < 300; ++op) {
      const auto [kind, jobs] = NextChurnStep(gen, s, now);
      if (kind == 0 || jobs.empty()) {
        ASSERT_TRUE(AddRandomJob(s, gen, next_id, 30, 30, 4, now));
        if (gen() % 2 == 0) s.SetBatch(next_id, 1 + gen() % 4);
        const uint64_t keep = gen() % 4;
        s.UndecideTails(next_id, [keep](JobId j) { return j % 3 == 0 ? UINT64_MAX : keep; });
        ++next_id;
      } else if (kind == 1) {
        ASSERT_TRUE(s.RemoveJob(jobs[gen() % jobs.size()]).ok());
      } else if (kind < 5) {
        s.Tick(now);
      } else {
        const JobId j = jobs[gen() % jobs.size()];
        const size_t n = std::min<size_t>(s.Queue(j)->size(), gen() % 5);
        (void)s.MayTake(j, n, gen() % 4, now);  // its answer may be ignored; no state but held
        std::vector<SampleId> taken;
        for (size_t i = 0; i < n; ++i) taken.push_back((*s.Queue(j))[i].sample);
        ASSERT_TRUE(s.Consume(j, n, now).ok());
        // Owed when another job's queue still holds it (this job's own later epoch does not).
        for (SampleId x : taken) {
          for (JobId other : s.Jobs()) {
            if (other == j) continue;
            for (const Decision& d : *s.Queue(other)) {
              if (d.sample == x) owed.insert(x);
            }
          }
        }
        if (s.Finished(j)) {
          ASSERT_TRUE(s.RemoveJob(j).ok());
        }
      }
      const std::map<SampleId, int64_t> queued = RecountDecided(s);
      std::erase_if(owed, [&](SampleId x) { return queued.count(x) == 0; });
      ASSERT_EQ(sink.decided, queued) << "trial " << trial << " op " << op;
      ASSERT_EQ(s.pacing().owed, owed.size()) << "trial " << trial << " op " << op;
      for (JobId j : s.Jobs()) {
        uint64_t behind = 0;
        for (const Decision& d : *s.Queue(j)) behind += owed.count(d.sample);
        ASSERT_EQ(s.Stats(j)->behind, behind) << "trial " << trial << " op " << op << " job " << j;
      }
    }
    for (JobId j : s.Jobs()) ASSERT_TRUE(s.RemoveJob(j).ok());
    EXPECT_TRUE(sink.decided.empty());
    EXPECT_EQ(s.pacing().owed, 0u);
  }
}

// Two jobs with the same queue: the first to take a batch leads; past the window it is held
// while the follower, whose batch makes nothing owed, always moves.
// Jobs 1..jobs over ids [0, ids), each `prefetch` samples decided together at time 0.
void AddIdenticalJobs(Scheduler& s, uint32_t ids, JobId jobs, uint64_t prefetch) {
  for (JobId j = 1; j <= jobs; ++j) ASSERT_TRUE(s.AddJob(j, Range(0, ids), 1, prefetch, 0).ok());
  s.Tick(0);
}

TEST(SchedulerTest, PacingHoldsTheLeaderAndNeverTheFollower) {
  Scheduler s(Opts(64), nullptr);
  AddIdenticalJobs(s, 100, 2, 16);
  ASSERT_EQ(*s.Queue(1), *s.Queue(2)) << "identical jobs decide together";
  EXPECT_TRUE(s.MayTake(1, 4, 0, 0)) << "capacity unknown: no pacing";
  s.SetCapacity(12);  // window = 12 - pinned - 4 = 8 owed samples
  EXPECT_TRUE(s.MayTake(1, 4, 0, 0));
  ASSERT_TRUE(s.Consume(1, 4, 0).ok());
  EXPECT_EQ(s.pacing().owed, 4u);
  EXPECT_EQ(s.Stats(2)->behind, 4u);
  EXPECT_TRUE(s.MayTake(1, 4, 0, 1)) << "4 owed + 4 fresh <= 8";
  ASSERT_TRUE(s.Consume(1, 4, 1).ok());
  EXPECT_FALSE(s.MayTake(1, 4, 0, 2)) << "8 owed + 4 fresh > 8: the leader waits";
  EXPECT_FALSE(s.MayTake(1, 4, 4, 2)) << "pins shrink the window further";
  EXPECT_TRUE(s.MayTake(2, 4, 0, 2)) << "the follower's batch makes nothing owed";
  ASSERT_TRUE(s.Consume(2, 4, 2).ok());
  EXPECT_EQ(s.pacing().owed, 4u);
  EXPECT_TRUE(s.MayTake(1, 4, 0, 3)) << "the follower took 4: room again";
  EXPECT_EQ(s.pacing().holds, 1u) << "one batch held, however often asked";
  EXPECT_DOUBLE_EQ(s.Stats(1)->held, 1.0) << "held from t=2 to t=3";
}

// A job whose build overlaps its previous one (GPU decode in its process) asks for the batch after
// the one it took: pacing judges that batch, not the front one again.
TEST(SchedulerTest, PacingJudgesTheBatchAfterTheOnesTaken) {
  Scheduler s(Opts(64), nullptr);
  AddIdenticalJobs(s, 100, 3, 16);
  s.SetCapacity(12);                     // window = 12 - pinned - 4 = 8 owed samples
  ASSERT_TRUE(s.Consume(2, 8, 0).ok());  // job 2 leads by 8
  ASSERT_TRUE(s.Consume(1, 4, 0).ok());  // job 1 by 4; job 3 took nothing
  ASSERT_EQ(s.pacing().owed, 8u);
  // Job 1's front batch is owed already (job 2 took it): taking it makes nothing owed.
  EXPECT_TRUE(s.MayTake(1, 4, 0, 1));
  // That batch taken and not consumed, the next one is fresh: 8 owed + 4 > 8, and job 3 is
  // further behind than job 1, so job 1 waits.
  EXPECT_FALSE(s.MayTake(1, 4, 0, 1, /*skip=*/4));
  EXPECT_TRUE(s.MayTake(3, 4, 0, 1, /*skip=*/0)) << "the furthest behind always moves";
}

// Four identical jobs joining one after another, the first ones consuming meanwhile. Without
// UndecideTails the first keeps hundreds of samples decided alone, which the last must draw on
// its own later; with it each running job gives back all but its front batch at every join, and
// from then on the four queues hold the same samples.
TEST(SchedulerTest, JoiningJobsShareWhatTheRunningOnesDecidedAhead) {
  constexpr uint64_t kBatch = 32;
  auto gap_of_last_to_first = [](bool undecide) {
    CountingSink sink;
    Scheduler s(Opts(0, 11), &sink);
    s.SetCapacity(400);
    double now = 0;
    for (JobId j = 1; j <= 4; ++j) {
      EXPECT_TRUE(s.AddJob(j, Range(0, 4000), 1, 8 * kBatch, now).ok());
      s.SetBatch(j, kBatch);
      if (undecide) {
        const uint64_t back = s.UndecideTails(j, [](JobId) { return kBatch; });
        if (j > 1) {
          EXPECT_GT(back, 0u) << "job " << j << " joined; the others decided ahead";
        }
      }
      for (int step = 0; step < 6; ++step) {  // the running jobs consume a few batches
        s.Tick(now);
        for (JobId k = 1; k <= j; ++k) EXPECT_TRUE(s.Consume(k, kBatch, now).ok());
        now += 0.1;
      }
      EXPECT_EQ(sink.counts, Recount(s));
      EXPECT_EQ(sink.decided, RecountDecided(s));
    }
    s.Tick(now);
    // How far the first job runs ahead: the mean gap between where the last job's next 128
    // samples sit in the first job's queue and in its own (samples the first does not hold
    // count as its whole queue: it took them long ago, alone).
    const auto& first = *s.Queue(1);
    std::map<SampleId, size_t> at;
    for (size_t i = 0; i < first.size(); ++i) at.emplace(first[i].sample, i);
    const auto& last = *s.Queue(4);
    const size_t n = std::min<size_t>(128, last.size());
    double gap = 0;
    for (size_t i = 0; i < n; ++i) {
      auto it = at.find(last[i].sample);
      gap += std::fabs(static_cast<double>(it != at.end() ? it->second : first.size()) -
                       static_cast<double>(i));
    }
    return gap / static_cast<double>(n);
  };
  const double with = gap_of_last_to_first(true);
  const double without = gap_of_last_to_first(false);
  // The kept front batch, and the few samples the last job draws that the first took before.
  EXPECT_LE(with, 2.0 * kBatch) << "the four queues line up within about the kept front batch";
  EXPECT_GE(without, 4.0 * kBatch) << "without giving back, the first job ran ahead alone";
}

// A queue that runs into the next epoch gives back only that epoch's entries (its R is the one in
// the tree); the earlier epoch's stay, even past `keep`. With pacing off nothing goes back.
TEST(SchedulerTest, UndecideTailsGivesBackOnlyTheEpochInTheTree) {
  CountingSink sink;
  Scheduler s(Opts(64), &sink);
  ASSERT_TRUE(s.AddJob(1, Range(0, 10), 2, 15, 0).ok());
  s.Tick(0);
  ASSERT_EQ(s.Queue(1)->size(), 15u);
  ASSERT_EQ(s.Queue(1)->back().epoch, 1u);
  ASSERT_EQ(s.tree().Remaining(1), 5u);
  ASSERT_TRUE(s.AddJob(2, Range(0, 10), 1, 4, 0).ok());
  EXPECT_EQ(s.UndecideTails(2, [](JobId) { return uint64_t{0}; }), 5u);
  ASSERT_EQ(s.Queue(1)->size(), 10u) << "epoch 0's entries stay";
  for (const Decision& d : *s.Queue(1)) EXPECT_EQ(d.epoch, 0u);
  EXPECT_EQ(s.tree().Remaining(1), 10u) << "epoch 1's R is whole again";
  EXPECT_EQ(sink.counts, Recount(s));
  EXPECT_EQ(sink.decided, RecountDecided(s));
  EXPECT_EQ(s.UndecideTails(2, [](JobId) { return uint64_t{0}; }), 0u) << "nothing left to give";

  SchedulerOptions off = Opts(64);
  off.pacing = false;
  Scheduler t(off, nullptr);
  ASSERT_TRUE(t.AddJob(1, Range(0, 10), 1, 8, 0).ok());
  t.Tick(0);
  ASSERT_TRUE(t.AddJob(2, Range(0, 10), 1, 8, 0).ok());
  EXPECT_EQ(t.UndecideTails(2, [](JobId) { return uint64_t{0}; }), 0u) << "pacing off";
  EXPECT_EQ(t.Queue(1)->size(), 8u);
}

// A Tick past its deadline runs one round and says it stopped short; later Ticks finish the
// same decisions a Tick without a deadline makes in one go (the engine's lock is let go between).
TEST(SchedulerTest, TickWithADeadlineDecidesInSlicesTheSameSamples) {
  Scheduler sliced(Opts(64), nullptr), whole(Opts(64), nullptr);
  for (Scheduler* s : {&sliced, &whole}) {
    ASSERT_TRUE(s->AddJob(1, Range(0, 1000), 1, 48, 0, {}).ok());
    ASSERT_TRUE(s->AddJob(2, Range(500, 1500), 1, 48, 0, {}).ok());
  }
  const auto past = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  EXPECT_EQ(sliced.Tick(0, nullptr, past), 1u);
  EXPECT_TRUE(sliced.cut_short());
  uint64_t rounds = 1, ticks = 1;
  while (sliced.cut_short()) {
    rounds += sliced.Tick(0, nullptr, past);
    ++ticks;
  }
  EXPECT_EQ(rounds, whole.Tick(0));
  EXPECT_FALSE(whole.cut_short());
  EXPECT_EQ(ticks, rounds) << "one round per Tick";
  EXPECT_EQ(*sliced.Queue(1), *whole.Queue(1));
  EXPECT_EQ(*sliced.Queue(2), *whole.Queue(2));
}

// An idle job beside a busy one decides at most an epoch of its own dataset ahead, however large
// L is: before, it joined every round below L, and its queue (and its removal's work) grew to
// 200,000 decisions in `carpool bench control`.
TEST(SchedulerTest, AnIdleJobDecidesAtMostAnEpochAheadOfItsDeliveries) {
  Scheduler s(Opts(1000000), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 100), 1000, 8, 0, {}).ok());     // idle: never consumes
  ASSERT_TRUE(s.AddJob(2, Range(0, 100000), 1, 64, 0, {}).ok());  // busy
  for (int step = 0; step < 200; ++step) {
    s.Tick(step);
    ASSERT_TRUE(s.Consume(2, s.Queue(2)->size(), step).ok());
  }
  EXPECT_GE(s.Stats(2)->delivered, 10000u) << "the busy job ran";
  EXPECT_LE(s.Queue(1)->size(), 100u + 2 * 8) << "one epoch and twice its prefetch";
  EXPECT_GE(s.Queue(1)->size(), 100u) << "still decided with the busy job up to there";
}

// Both jobs' clients in one state from `from` to `to`, then each consumes its count at `to`
// (the same instant, so that their paces are counts over the same fed time).
void RunClients(Scheduler& s, ClientState leader, ClientState lagger, double from, double to,
                size_t leader_takes, size_t lagger_takes) {
  s.NoteClient(1, leader, from);
  s.NoteClient(2, lagger, from);
  s.NoteClient(1, leader, to);
  s.NoteClient(2, lagger, to);
  ASSERT_TRUE(s.Consume(1, leader_takes, to).ok());
  if (lagger_takes > 0) {
    ASSERT_TRUE(s.Consume(2, lagger_takes, to).ok());
  }
}

// A leader whose follower waits on its own client (all slots full) most of the time, and which
// is clearly faster by nature, is let go. Pacing off never holds.
TEST(SchedulerTest, PacingLiftsForAClientBoundSlowerFollowerAndCanBeOff) {
  for (bool pacing : {true, false}) {
    SchedulerOptions o = Opts(64);
    o.pacing = pacing;
    Scheduler s(o, nullptr);
    AddIdenticalJobs(s, 100, 2, 16);
    s.SetCapacity(8);  // window 4
    // Over 4 s both clients are fed, the leader takes 8 samples and the follower 4.
    RunClients(s, ClientState::kWaitingOnServer, ClientState::kWaitingOnServer, 0, 4, 8, 4);
    EXPECT_DOUBLE_EQ(s.Stats(1)->pace, 2.0);
    EXPECT_DOUBLE_EQ(s.Stats(2)->pace, 1.0);
    EXPECT_EQ(s.MayTake(1, 4, 0, 4), !pacing) << "pacing " << pacing << ": 4 owed + 4 fresh";
    if (!pacing) continue;
    // The follower is not client-bound (it waits on the server): still held.
    s.NoteClient(2, ClientState::kWaitingOnServer, 5);
    EXPECT_FALSE(s.MayTake(1, 4, 0, 5));
    // Then its client is the bound for 4 s: more than half of the decayed time.
    s.NoteClient(2, ClientState::kBound, 5);
    s.NoteClient(2, ClientState::kBound, 9);
    EXPECT_GT(s.Stats(2)->client_bound, 0.5);
    EXPECT_TRUE(s.MayTake(1, 4, 0, 9)) << "lifted";
    EXPECT_EQ(s.pacing().lifts, 1u);
  }
}

// The jitter case: the follower is client-bound, but the leader is no faster by nature (paces
// 2.0 and 1.75, under the 20% margin), so the lead is held. Before the pace, clients starved for
// CPU all counted as client-bound and every such lead escaped the window. A held leader's
// starved time does not lower its pace.
TEST(SchedulerTest, PacingHoldsALeaderNoFasterByNatureThanItsClientBoundFollower) {
  Scheduler s(Opts(64), nullptr);
  AddIdenticalJobs(s, 100, 2, 16);
  s.SetCapacity(8);  // window 4
  RunClients(s, ClientState::kWaitingOnServer, ClientState::kBound, 0, 4, 8, 7);
  EXPECT_GT(s.Stats(2)->client_bound, 0.5);
  EXPECT_FALSE(s.MayTake(1, 4, 0, 4)) << "1 owed + 4 fresh, and a lead of noise";
  EXPECT_EQ(s.pacing().lifts, 0u);
  // Held, the leader's client starves for 4 s; its pace stays where it was, decayed with its
  // samples, so the hold does not make it look faster or slower.
  const double pace = s.Stats(1)->pace;
  s.NoteClient(1, ClientState::kStarved, 4);
  s.NoteClient(1, ClientState::kStarved, 8);
  EXPECT_NEAR(s.Stats(1)->pace, pace, 1e-9);
  // A leader twice as fast as the follower is lifted past it.
  Scheduler t(Opts(64), nullptr);
  AddIdenticalJobs(t, 100, 2, 16);
  t.SetCapacity(8);
  RunClients(t, ClientState::kWaitingOnServer, ClientState::kBound, 0, 4, 8, 4);
  EXPECT_TRUE(t.MayTake(1, 4, 0, 4));
  EXPECT_EQ(t.pacing().lifts, 1u);
}

// Preparing ahead looks as far as the cache holds while it has empty room, and once it is full
// only as far as the jobs' prefetch depths added up (never past the capacity).
TEST(SchedulerTest, PrepareAheadHorizonShrinksToThePrefetchDepthsOnceTheCacheIsFull) {
  Scheduler s(Opts(64), nullptr);
  AddIdenticalJobs(s, 1000, 3, 16);
  EXPECT_EQ(s.PrepareAheadHorizon(0), UINT64_MAX) << "no capacity known: no limit";
  s.SetCapacity(200);
  EXPECT_EQ(s.PrepareAheadHorizon(0), 200u);
  EXPECT_EQ(s.PrepareAheadHorizon(199), 200u) << "one empty slot left";
  EXPECT_EQ(s.PrepareAheadHorizon(200), 3u * 16) << "full: 3 jobs x 16";
  EXPECT_EQ(s.PrepareAheadHorizon(260), 3u * 16);
  s.SetCapacity(40);
  EXPECT_EQ(s.PrepareAheadHorizon(40), 40u) << "never past the capacity";
}

// The lift pays for re-preparations with spare CPU only: a leader twice as fast as its
// client-bound follower is held while less than a tenth of the CPU idles (the sweeps' trials fill
// the CPU, and a lead of the OS's luck looks like one of nature), and lifted once a tenth idles
// or when nothing measures the CPU.
TEST(SchedulerTest, PacingLiftsOnlyWithSpareCpu) {
  struct Case {
    std::optional<double> spare;
    bool lifted;
  };
  for (const Case& c : {Case{0.02, false}, Case{0.0999, false}, Case{0.1, true}, Case{0.5, true},
                        Case{std::nullopt, true}}) {
    Scheduler s(Opts(64), nullptr);
    AddIdenticalJobs(s, 100, 2, 16);
    s.SetCapacity(8);  // window 4
    s.SetSpareCpu(c.spare);
    RunClients(s, ClientState::kWaitingOnServer, ClientState::kBound, 0, 4, 8, 4);
    const std::string spare = c.spare ? std::to_string(*c.spare) : "not known";
    EXPECT_EQ(s.MayTake(1, 4, 0, 4), c.lifted) << "spare CPU " << spare;
    EXPECT_EQ(s.pacing().lifts, c.lifted ? 1u : 0u) << "spare CPU " << spare;
    EXPECT_DOUBLE_EQ(s.pacing().spare_cpu, c.spare.value_or(-1.0));
  }
}

// Two fast jobs level with each other and one slow, client-bound job: the fast ones are lifted
// past the slow one; neither counts as the other's lagger (both held, neither client-bound).
TEST(SchedulerTest, PacingLiftsTwoFastJobsPastOneSlowOne) {
  Scheduler s(Opts(64), nullptr);
  AddIdenticalJobs(s, 100, 3, 16);
  s.SetCapacity(8);  // window 4
  for (JobId j : {1, 2, 3}) {
    s.NoteClient(j, j == 3 ? ClientState::kBound : ClientState::kWaitingOnServer, 0);
  }
  for (JobId j : {1, 2, 3}) {
    s.NoteClient(j, j == 3 ? ClientState::kBound : ClientState::kWaitingOnServer, 4);
  }
  ASSERT_TRUE(s.Consume(1, 8, 4).ok());
  ASSERT_TRUE(s.Consume(2, 8, 4).ok());
  ASSERT_TRUE(s.Consume(3, 4, 4).ok());
  EXPECT_EQ(s.Stats(2)->behind, 0u);
  EXPECT_EQ(s.Stats(3)->behind, 4u);
  EXPECT_TRUE(s.MayTake(1, 4, 0, 4)) << "job 2 is level with job 1, not its lagger";
  ASSERT_TRUE(s.Consume(1, 4, 4).ok());
  EXPECT_TRUE(s.MayTake(2, 4, 0, 4)) << "job 2 follows job 1: nothing fresh";
}

// A cache that holds every sample of every job beside the batches in flight never holds a job:
// owed + fresh is at most the union, which is within the window.
TEST(SchedulerTest, PacingNeverHoldsWhenTheCacheHoldsEverything) {
  Scheduler s(Opts(64), nullptr);
  AddIdenticalJobs(s, 20, 2, 20);
  s.SetCapacity(28);  // 20 samples + 4 pinned + a batch of 4
  ASSERT_TRUE(s.Consume(1, 16, 0).ok());
  EXPECT_TRUE(s.MayTake(1, 4, 4, 0)) << "16 owed + 4 fresh fit the window of 20";
  s.SetCapacity(27);
  EXPECT_FALSE(s.MayTake(1, 4, 4, 0)) << "one sample short: the leader waits";
}

TEST(SchedulerTest, SinkCanBeSetBeforeTheFirstJobOnly) {
  CountingSink sink;
  Scheduler s(Opts(8), nullptr);
  ASSERT_TRUE(s.SetRefCountSink(&sink).ok());
  ASSERT_TRUE(s.AddJob(1, Range(0, 3), 1, 2, 0).ok());
  EXPECT_EQ(sink.counts, (std::map<SampleId, int64_t>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(s.SetRefCountSink(nullptr).code(), StatusCode::kFailedPrecondition);
}

// The server's wiring: the scheduler feeds SampleCache's reference counts and next uses.
TEST(SchedulerTest, FeedsSampleCacheReferenceCounts) {
  Scheduler s(Opts(8), nullptr);
  cache::CacheOptions options;  // capacity 0: no segment, counts only
  options.policy = cache::EvictionPolicy::kNextUse;
  auto created = cache::SampleCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  cache::SampleCache& sample_cache = **created;
  RefCountForwarder<cache::SampleCache> refs(&sample_cache);
  ASSERT_TRUE(s.SetRefCountSink(&refs).ok());
  ASSERT_TRUE(s.AddJob(1, Range(0, 10), 1, 4, 0).ok());
  ASSERT_TRUE(s.AddJob(2, Range(5, 15), 1, 4, 0).ok());
  s.Tick(0);
  const SampleId first = s.Queue(1)->front().sample;
  const uint32_t before = sample_cache.RefCount(first);
  // A decided sample has a finite next use, a sample no job holds none.
  const std::vector<uint32_t> ask = {first, 99};
  std::vector<double> when(2);
  sample_cache.NextUses(ask, when);
  // Decided: its estimated time (seconds), far below an undecided sample's kUndecidedSeconds / count.
  EXPECT_LT(when[0], 1e6) << "decided: its estimated time";
  EXPECT_TRUE(std::isinf(when[1]));
  ASSERT_TRUE(s.Consume(1, 1, 1).ok());
  EXPECT_EQ(sample_cache.RefCount(first), before - 1);
  ASSERT_TRUE(s.RemoveJob(1).ok());
  ASSERT_TRUE(s.RemoveJob(2).ok());
  for (SampleId x = 0; x < 15; ++x) EXPECT_EQ(sample_cache.RefCount(x), 0u) << x;
  std::vector<uint32_t> all(15);
  std::iota(all.begin(), all.end(), 0u);
  std::vector<double> after(15);
  sample_cache.NextUses(all, after);
  for (double t : after) EXPECT_TRUE(std::isinf(t)) << "no queue holds anything any more";
}

TEST(SchedulerTest, TriggerAndParticipation) {
  Scheduler s(Opts(/*lookahead=*/16), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 100), 1, 4, 0).ok());
  ASSERT_TRUE(s.AddJob(2, Range(0, 100), 1, 4, 0).ok());
  // Both start empty: rounds run until both hold their prefetch depth, and no further.
  EXPECT_EQ(s.Tick(0), 4u);
  EXPECT_EQ(s.Queue(1)->size(), 4u);
  EXPECT_EQ(s.Queue(2)->size(), 4u);
  EXPECT_EQ(s.Tick(0), 0u) << "no queue is below its prefetch: no round";
  // Job 1 consumes one: one round, and job 2 (below L) takes part in it too.
  ASSERT_TRUE(s.Consume(1, 1, 1).ok());
  EXPECT_EQ(s.Tick(1), 1u);
  EXPECT_EQ(s.Queue(1)->size(), 4u);
  EXPECT_EQ(s.Queue(2)->size(), 5u);
  // Identical R's share every round, so the queues agree where they overlap.
  const auto& q1 = *s.Queue(1);
  const auto& q2 = *s.Queue(2);
  for (size_t i = 0; i < q1.size(); ++i) EXPECT_EQ(q1[i].sample, q2[i + 1].sample);
}

TEST(SchedulerTest, JobsAtLookaheadAreMasked) {
  const uint64_t kL = 8;
  Scheduler s(Opts(kL), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 500), 1, 2, 0).ok());
  ASSERT_TRUE(s.AddJob(2, Range(0, 500), 1, 2, 0).ok());
  std::vector<Assignment> decided;
  int rounds_with_2_at_l = 0;
  for (int t = 1; t <= 100; ++t) {
    const bool two_at_l = s.Queue(2)->size() == kL;
    decided.clear();
    ASSERT_TRUE(s.Consume(1, s.Queue(1)->size() > 0 ? 1 : 0, t).ok());
    s.Tick(t, &decided);
    EXPECT_LE(s.Queue(2)->size(), kL);
    if (!two_at_l) continue;
    for (const Assignment& a : decided) {
      ++rounds_with_2_at_l;
      EXPECT_EQ(std::count(a.jobs.begin(), a.jobs.end(), JobId{2}), 0)
          << "job 2 is at L and must not take part";
    }
  }
  EXPECT_EQ(s.Queue(2)->size(), kL) << "the idle job fills up to L, then stops";
  EXPECT_GT(rounds_with_2_at_l, 50);
}

TEST(SchedulerTest, PrefetchIsClampedToLookahead) {
  Scheduler s(Opts(3), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 10), 1, 100, 0).ok());
  s.Tick(0);
  EXPECT_EQ(s.Queue(1)->size(), 3u);
  EXPECT_EQ(s.Stats(1)->prefetch, 3u);
}

TEST(SchedulerTest, RejectsBadJobs) {
  Scheduler s(Opts(8), nullptr);
  EXPECT_EQ(s.AddJob(1, Roaring(), 1, 4, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.AddJob(1, Range(0, 5), 0, 4, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.AddJob(1, Range(0, 5), 1, 0, 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.AddJob(1, Range(0, 5), 1, 4, 0).ok());
  EXPECT_EQ(s.AddJob(1, Range(0, 5), 1, 4, 0).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.RemoveJob(9).code(), StatusCode::kNotFound);
  s.Tick(0);
  EXPECT_EQ(s.Consume(1, 5, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Consume(9, 1, 0).code(), StatusCode::kNotFound);
}

// Drives jobs by batches through NextBatch/Consume and checks that each job sees its dataset
// exactly once per epoch, with epochs in order and a short last batch only at an epoch's end.
TEST(SchedulerTest, ExactlyOncePerEpochWithPartialLastBatch) {
  CountingSink sink;
  Scheduler s(Opts(/*lookahead=*/64, 3), &sink);
  struct Spec {
    JobId id;
    Roaring ds;
    uint32_t epochs;
    size_t batch;
    int period;  // consumes one batch every `period` ticks
  };
  std::vector<Spec> specs = {
      {1, Range(0, 50), 3, 7, 1}, {2, Range(25, 75), 2, 8, 2}, {3, Range(0, 50), 2, 50, 3}};
  for (const Spec& sp : specs) ASSERT_TRUE(s.AddJob(sp.id, sp.ds, sp.epochs, sp.batch, 0).ok());
  std::map<JobId, std::vector<std::vector<SampleId>>> seen;  // per job, per epoch
  std::vector<Decision> batch;
  for (int t = 0; t < 1000 && s.size() > 0; ++t) {
    s.Tick(t);
    for (const Spec& sp : specs) {
      if (!s.Contains(sp.id) || t % sp.period != 0) continue;
      ASSERT_TRUE(s.NextBatch(sp.id, sp.batch, &batch)) << "prefetch >= batch: always ready";
      auto& epochs = seen[sp.id];
      for (const Decision& d : batch) {
        if (d.epoch == epochs.size()) epochs.emplace_back();
        ASSERT_EQ(d.epoch + 1, epochs.size()) << "epochs are delivered in order";
        epochs.back().push_back(d.sample);
      }
      if (batch.size() < sp.batch) {
        EXPECT_EQ(epochs.back().size(), sp.ds.cardinality()) << "short batch only at the end";
      }
      ASSERT_TRUE(s.Consume(sp.id, batch.size(), t).ok());
      if (s.Finished(sp.id)) {
        ASSERT_TRUE(s.RemoveJob(sp.id).ok());
      }
    }
  }
  EXPECT_EQ(s.size(), 0u);
  EXPECT_TRUE(sink.counts.empty());
  for (const Spec& sp : specs) {
    ASSERT_EQ(seen[sp.id].size(), sp.epochs) << "job " << sp.id;
    for (auto& epoch : seen[sp.id]) {
      std::sort(epoch.begin(), epoch.end());
      std::vector<SampleId> want;
      for (uint32_t x : sp.ds) want.push_back(x);
      EXPECT_EQ(epoch, want) << "job " << sp.id << ": each sample exactly once per epoch";
    }
  }
}

TEST(SchedulerTest, NextBatchWaitsForUndecidedSamples) {
  Scheduler s(Opts(64), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 10), 2, 4, 0).ok());
  std::vector<Decision> batch;
  EXPECT_FALSE(s.NextBatch(1, 4, &batch)) << "nothing decided yet";
  s.Tick(0);
  EXPECT_FALSE(s.NextBatch(1, 6, &batch)) << "4 decided, 6 wanted, epoch not fully decided";
  EXPECT_TRUE(batch.empty());
  ASSERT_TRUE(s.NextBatch(1, 4, &batch));
  EXPECT_EQ(batch.size(), 4u);
  ASSERT_TRUE(s.Consume(1, 8, 0).code() == StatusCode::kInvalidArgument);
  // Decide the rest of epoch 0 and part of epoch 1 by consuming; the last batch of epoch 0 is 2.
  ASSERT_TRUE(s.Consume(1, 4, 1).ok());
  s.Tick(1);
  ASSERT_TRUE(s.Consume(1, 4, 2).ok());
  s.Tick(2);
  ASSERT_TRUE(s.NextBatch(1, 4, &batch));
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].epoch, 0u);
  EXPECT_EQ(s.Queue(1)->back().epoch, 1u) << "look-ahead crosses the epoch boundary";
}

// A job whose next build starts before the previous one is consumed takes the batch after it:
// the same decisions, in the same order, as taking them one at a time.
TEST(SchedulerTest, NextBatchAfterTheBatchesTaken) {
  Scheduler s(Opts(64), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 10), 2, 8, 0).ok());
  s.Tick(0);
  const std::deque<Decision> queue = *s.Queue(1);
  ASSERT_EQ(queue.size(), 8u);
  std::vector<Decision> first, second, none;
  ASSERT_TRUE(s.NextBatch(1, 3, &first));
  ASSERT_TRUE(s.NextBatch(1, 3, &second, 3));
  ASSERT_EQ(second.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first[i].sample, queue[i].sample);
    EXPECT_EQ(second[i].sample, queue[3 + i].sample);
  }
  EXPECT_FALSE(s.NextBatch(1, 3, &none, 8)) << "nothing queued past the batches taken";
  EXPECT_FALSE(s.NextBatch(1, 3, &none, 6)) << "2 left of an epoch still being decided";
  // Consuming the first batch makes the second the front, as taken.
  ASSERT_TRUE(s.Consume(1, 3, 1).ok());
  std::vector<Decision> front;
  ASSERT_TRUE(s.NextBatch(1, 3, &front));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(front[i].sample, second[i].sample);
  // At an epoch's end the batch after the taken ones is short, never one across the boundary.
  ASSERT_TRUE(s.Consume(1, 3, 2).ok());
  s.Tick(2);
  std::vector<Decision> tail;
  ASSERT_TRUE(s.NextBatch(1, 3, &tail, 3));
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0].epoch, 0u);
}

TEST(SchedulerTest, RatesFromDeliveries) {
  SchedulerOptions o = Opts(64);
  o.prior_rate = 3.0;
  Scheduler s(o, nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 1000), 1, 8, 0).ok());
  EXPECT_DOUBLE_EQ(s.Stats(1)->rate, 3.0) << "the prior before any measurement";
  ASSERT_TRUE(s.AddJob(2, Range(0, 1000), 1, 8, 0).ok());
  for (int t = 0; t <= 40; ++t) {
    s.Tick(t);
    ASSERT_TRUE(s.Consume(1, 2, t).ok());  // 2 per clock unit
    if (t % 2 == 0) {
      ASSERT_TRUE(s.Consume(2, 1, t).ok());  // 0.5 per clock unit
    }
  }
  EXPECT_NEAR(s.Stats(1)->rate, 2.0, 1e-9);
  EXPECT_NEAR(s.Stats(2)->rate, 0.5, 1e-9);
  ASSERT_TRUE(s.AddJob(3, Range(0, 10), 1, 8, 40).ok());
  EXPECT_NEAR(s.Stats(3)->rate, 1.25, 1e-9) << "a new job gets the mean of the measured rates";
  s.Tick(60);  // twenty clock units without a delivery
  EXPECT_LT(s.Stats(1)->rate, 1.0) << "a stalled job's rate decays";
}

// Adds jobs 1 and 2 and delivers 4 and 1 samples to them every 2 clock units until `until`
// (rates 2 and 0.5), then ticks at `until`.
void RunTwoJobsAtRates2And05(Scheduler& s, const Roaring& a, const Roaring& b, uint64_t prefetch,
                             int until) {
  ASSERT_TRUE(s.AddJob(1, a, 1, prefetch, 0).ok());
  ASSERT_TRUE(s.AddJob(2, b, 1, prefetch, 0).ok());
  for (int t = 0; t <= until; t += 2) {
    s.Tick(t);
    ASSERT_TRUE(s.Consume(1, 4, t).ok());
    ASSERT_TRUE(s.Consume(2, 1, t).ok());
  }
  s.Tick(until);
}

// From-scratch next use: min over jobs of (queue position) / rate, else for a sample of R the
// expected draw position (|queue| + (|R| + 1) / 2) / rate, else for a sample of the dataset with
// epochs left (|queue| + |R| + (|D| + 1) / 2) / rate; +infinity otherwise.
double ReferenceNextUse(const Scheduler& s, const std::map<JobId, Roaring>& datasets, SampleId x) {
  double best = std::numeric_limits<double>::infinity();
  for (JobId j : s.Jobs()) {
    const Scheduler::JobStats st = *s.Stats(j);
    const auto& q = *s.Queue(j);
    double pos = -1;
    for (size_t i = 0; i < q.size() && pos < 0; ++i) {
      if (q[i].sample == x) pos = static_cast<double>(i);
    }
    const double qn = static_cast<double>(q.size()), r = static_cast<double>(st.remaining);
    const Roaring& d = datasets.at(j);
    if (pos < 0 && s.tree().RemainingSet(j)->contains(x)) pos = qn + (r + 1) / 2;
    if (pos < 0 && st.epoch + 1 < st.epochs && d.contains(x)) {
      pos = qn + r + (static_cast<double>(d.cardinality()) + 1) / 2;
    }
    if (pos >= 0) best = std::min(best, pos / st.rate);
  }
  return best;
}

TEST(SchedulerTest, NextUseIsEarliestPositionOverRate) {
  Scheduler s(Opts(16), nullptr);
  RunTwoJobsAtRates2And05(s, Range(0, 40), Range(20, 60), 8, 4);
  const double r1 = s.Stats(1)->rate, r2 = s.Stats(2)->rate;
  ASSERT_NEAR(r1, 2.0, 1e-9);
  ASSERT_NEAR(r2, 0.5, 1e-9);
  const std::map<JobId, Roaring> datasets = {{1, Range(0, 40)}, {2, Range(20, 60)}};
  for (SampleId x = 0; x < 70; ++x) {
    EXPECT_DOUBLE_EQ(s.NextUse(x), ReferenceNextUse(s, datasets, x)) << "sample " << x;
  }
  EXPECT_EQ(s.NextUse(65), std::numeric_limits<double>::infinity()) << "in no dataset";
  // Hand-checked: the second entry of job 2's queue is 1 / 0.5 = 2 clock units away unless job 1
  // needs it sooner (queued within 4 positions, or expected within 4 draws).
  const SampleId second = (*s.Queue(2))[1].sample;
  const auto& q1 = *s.Queue(1);
  auto pos =
      std::find_if(q1.begin(), q1.end(), [&](const Decision& d) { return d.sample == second; });
  double expected = pos == q1.end() ? 2.0 : std::min(2.0, (pos - q1.begin()) / 2.0);
  if (pos == q1.end() && s.tree().RemainingSet(1)->contains(second)) {
    expected = std::min(expected, (q1.size() + (s.Stats(1)->remaining + 1) / 2.0) / 2.0);
  }
  EXPECT_DOUBLE_EQ(s.NextUse(second), expected);
}

TEST(SchedulerTest, NextUseOfAnUndecidedSampleIsItsExpectedDrawPosition) {
  // One job, 10 samples, 2 epochs, prefetch 2, consuming 1 per clock unit (rate 1).
  Scheduler s(Opts(2), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 10), 2, 2, 0).ok());
  for (int t = 0; t <= 4; ++t) {
    s.Tick(t);
    ASSERT_TRUE(s.Consume(1, 1, t).ok());
  }
  s.Tick(4);
  ASSERT_NEAR(s.Stats(1)->rate, 1.0, 1e-9);
  const auto& q = *s.Queue(1);
  ASSERT_EQ(q.size(), 2u);
  ASSERT_EQ(s.Stats(1)->remaining, 3u);  // 5 delivered, 2 queued, 3 undecided
  const Roaring& r = *s.tree().RemainingSet(1);
  // Queued: its position.
  EXPECT_DOUBLE_EQ(s.NextUse(q[1].sample), 1.0);
  // In R: after the 2 queued, at a uniform position among 3 draws: 2 + (3 + 1) / 2 = 4.
  for (uint32_t x : r) EXPECT_DOUBLE_EQ(s.NextUse(x), 4.0) << x;
  // Delivered this epoch: in the next one, after queue and R: 2 + 3 + (10 + 1) / 2 = 10.5.
  int delivered = 0;
  for (SampleId x = 0; x < 10; ++x) {
    if (r.contains(x) || x == q[0].sample || x == q[1].sample) continue;
    EXPECT_DOUBLE_EQ(s.NextUse(x), 10.5) << x;
    ++delivered;
  }
  EXPECT_EQ(delivered, 5);
  EXPECT_EQ(s.NextUse(10), std::numeric_limits<double>::infinity());
}

TEST(SchedulerTest, NextUseOfADeliveredSampleInTheLastEpochIsNever) {
  Scheduler s(Opts(4), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 8), 1, 2, 0).ok());
  s.Tick(0);
  const SampleId first = (*s.Queue(1))[0].sample;
  ASSERT_TRUE(s.Consume(1, 1, 0).ok());
  s.Tick(0);
  EXPECT_EQ(s.NextUse(first), std::numeric_limits<double>::infinity());
  // A second job over the same ids still has it in R: expected at its |queue| + (8 + 1) / 2.
  ASSERT_TRUE(s.AddJob(2, Range(0, 8), 1, 2, 0).ok());
  const double rate2 = s.Stats(2)->rate;
  EXPECT_DOUBLE_EQ(s.NextUse(first), (0 + 4.5) / rate2);
}

TEST(SchedulerTest, PreparationOrderIsEarliestDeadlineFirst) {
  Scheduler s(Opts(32), nullptr);
  RunTwoJobsAtRates2And05(s, Range(0, 100), Range(50, 150), 16, 6);
  std::set<SampleId> ready;  // pretend every third queued sample is cached already
  for (JobId j : {1u, 2u}) {
    for (const Decision& d : *s.Queue(j)) {
      if (d.sample % 3 == 0) ready.insert(d.sample);
    }
  }
  std::vector<SampleId> order;
  s.NextToPrepare(
      1000, [&](SampleId x) { return ready.count(x) != 0; }, &order);
  std::set<SampleId> distinct(order.begin(), order.end());
  EXPECT_EQ(distinct.size(), order.size()) << "each sample once";
  size_t queued_not_ready = 0;
  std::set<SampleId> all;
  for (JobId j : {1u, 2u}) {
    for (const Decision& d : *s.Queue(j)) all.insert(d.sample);
  }
  for (SampleId x : all) queued_not_ready += ready.count(x) == 0;
  EXPECT_EQ(order.size(), queued_not_ready);
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(ready.count(order[i]), 0u);
    if (i > 0) {
      EXPECT_LE(s.NextUse(order[i - 1]), s.NextUse(order[i])) << i;
    }
  }
  std::vector<SampleId> first3;
  s.NextToPrepare(
      3, [&](SampleId x) { return ready.count(x) != 0; }, &first3);
  EXPECT_EQ(first3, std::vector<SampleId>(order.begin(), order.begin() + 3));
}

// With ready_persists the walk starts after the prefix found ready before: the same samples in
// the same order as a full walk, for a fraction of the predicate calls.
TEST(SchedulerTest, PreparationWalkSkipsTheKnownReadyPrefix) {
  Scheduler s(Opts(2048), nullptr);
  ASSERT_TRUE(s.AddJob(1, Range(0, 4000), 1, 2048, 0).ok());
  s.Tick(0);
  const std::deque<Decision>& queue = *s.Queue(1);
  ASSERT_EQ(queue.size(), 2048u);
  std::set<SampleId> ready;
  for (size_t i = 0; i < 1800; ++i) ready.insert(queue[i].sample);  // prepared ahead
  size_t calls = 0;
  auto is_ready = [&](SampleId x) {
    ++calls;
    return ready.count(x) != 0;
  };
  for (int round = 0; round < 4; ++round) {
    std::vector<SampleId> full, hinted;
    s.NextToPrepare(8, [&](SampleId x) { return ready.count(x) != 0; }, &full);
    calls = 0;
    s.NextToPrepare(8, is_ready, &hinted, SIZE_MAX, /*ready_persists=*/true);
    EXPECT_EQ(hinted, full) << "round " << round;
    if (round == 0) {
      EXPECT_GE(calls, 1800u);  // the first walk finds the prefix
    } else {
      EXPECT_LE(calls, 16u) << "round " << round << " walked the ready prefix again";
    }
    for (SampleId x : hinted) ready.insert(x);  // now in flight: ready
    ASSERT_TRUE(s.Consume(1, 100, round + 1).ok());  // the front moves on
  }
}

TEST(SchedulerTest, RemovalRestoresTheCountsOfTheOtherJobs) {
  CountingSink sink;
  Scheduler s(Opts(16), &sink);
  ASSERT_TRUE(s.AddJob(1, Range(0, 40), 2, 4, 0).ok());
  ASSERT_TRUE(s.AddJob(2, Range(20, 60), 2, 4, 0).ok());
  for (int t = 0; t < 30; ++t) {
    s.Tick(t);
    ASSERT_TRUE(s.Consume(1, 2, t).ok());
    if (t % 3 == 0) {
      ASSERT_TRUE(s.Consume(2, 1, t).ok());
    }
  }
  ASSERT_TRUE(s.RemoveJob(2).ok());
  // What job 1 alone accounts for: its R and its queue.
  std::map<SampleId, int64_t> alone;
  for (uint32_t x : *s.tree().RemainingSet(1)) ++alone[x];
  for (const Decision& d : *s.Queue(1)) ++alone[d.sample];
  EXPECT_EQ(sink.counts, alone);
  EXPECT_EQ(s.NextUse(59), std::numeric_limits<double>::infinity()) << "only job 2 had 40..59";
}

}  // namespace
}  // namespace carpool
