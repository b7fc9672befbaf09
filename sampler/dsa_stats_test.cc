// Statistical tests of the DSA on the real tree: per-round uniformity (Theorem 2), pairwise
// sharing (Theorem 1), and uniform permutations under churn. Every test fixes its seeds, states a
// family-wise significance level and derives its bounds from the sample counts (Bonferroni over
// the family). A correct sampler fails a test with probability at most that level.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "sampler/rng.h"
#include "sampler/sampling_tree.h"
#include "sampler/stats_testing.h"

namespace carpool {
namespace {

using testing::BinomialZPValue;
using testing::ChiSquarePValue;
using testing::PearsonUniform;

constexpr double kFamilyAlpha = 1e-3;

Roaring RandomSubset(std::mt19937_64& gen, uint32_t universe, double density) {
  Roaring r;
  std::bernoulli_distribution keep(density);
  for (uint32_t i = 0; i < universe; ++i) {
    if (keep(gen)) r.add(i);
  }
  if (r.isEmpty()) r.add(static_cast<uint32_t>(gen() % universe));
  return r;
}

// A random reachable state: `jobs` jobs on overlapping random datasets, then random masked
// rounds; with `churn`, jobs also join, leave and restart their epochs along the way.
SamplingTree RandomState(std::mt19937_64& gen, int jobs, uint32_t universe, bool churn) {
  SamplingTree tree(gen());
  JobId next = 0;
  for (int j = 0; j < jobs; ++j) {
    const double density = 0.4 + 0.5 * static_cast<double>(gen() % 64) / 64.0;
    EXPECT_TRUE(tree.AddJob(next++, RandomSubset(gen, universe, density)).ok());
  }
  const int history = static_cast<int>(gen() % universe);
  std::vector<Assignment> out;
  for (int i = 0; i < history; ++i) {
    std::vector<JobId> mask;
    for (const auto& s : tree.Nodes()) {
      if (gen() % 3 != 0) mask.push_back(s.job);
    }
    tree.RunRound(mask, &out);
    if (churn && gen() % 4 == 0) {
      auto nodes = tree.Nodes();
      const JobId victim = nodes[gen() % nodes.size()].job;
      EXPECT_TRUE(tree.RemoveJob(victim).ok());
      EXPECT_TRUE(tree.AddJob(next++, RandomSubset(gen, universe, 0.6)).ok());
      const JobId restart = tree.Nodes()[gen() % tree.size()].job;
      EXPECT_TRUE(tree.ResetEpoch(restart).ok());
    }
  }
  return tree;
}

// One round over `participants` from a copy of `state` reseeded with `seed`: `out` holds only
// that round's assignments. The state itself is left as it was, for the next trial.
void RoundOnACopy(const SamplingTree& state, uint64_t seed, std::span<const JobId> participants,
                  std::vector<Assignment>* out) {
  SamplingTree copy = state;
  copy.Reseed(seed);
  out->clear();
  copy.RunRound(participants, out);
}

// Adds a round's draws to the chi-square cells: counts[j][i] for the i-th id of R_j (ids[j]
// sorted). Fails the test on a sample outside its job's R.
void CountDraws(const std::vector<Assignment>& out, std::map<JobId, std::vector<SampleId>>& ids,
                std::map<JobId, std::vector<uint64_t>>& counts) {
  for (const Assignment& a : out) {
    for (JobId j : a.jobs) {
      auto it = std::lower_bound(ids[j].begin(), ids[j].end(), a.sample);
      ASSERT_TRUE(it != ids[j].end() && *it == a.sample) << "sample outside R of job " << j;
      ++counts[j][it - ids[j].begin()];
    }
  }
}

// For each state: run one round `kTrials` times from copies of the state with fresh seeds and
// test each participant's sample against uniform over its R (Pearson chi-square, df = |R|-1).
void CheckPerRoundUniformity(bool churn, uint64_t base_seed) {
  constexpr int kStates = 40;
  constexpr int kTrials = 2000;
  std::vector<double> p_values;
  for (int s = 0; s < kStates; ++s) {
    std::mt19937_64 gen(base_seed + s);
    const int jobs = 2 + s % 5;
    SamplingTree state = RandomState(gen, jobs, 12 + static_cast<uint32_t>(gen() % 9), churn);
    std::vector<JobId> participants;
    for (const auto& n : state.Nodes()) {
      if (n.remaining > 0 && gen() % 4 != 0) participants.push_back(n.job);
    }
    if (participants.empty()) participants.push_back(state.Nodes().back().job);
    std::shuffle(participants.begin(), participants.end(), gen);
    std::map<JobId, std::vector<SampleId>> r;  // sorted ids of R_j: the chi-square cells
    std::map<JobId, std::vector<uint64_t>> counts;
    for (JobId j : participants) {
      for (uint32_t x : *state.RemainingSet(j)) r[j].push_back(x);
      counts[j].assign(r[j].size(), 0);
    }
    std::vector<Assignment> out;
    for (int t = 0; t < kTrials; ++t) {
      RoundOnACopy(state, SplitMix64(base_seed * 1000003 + s * 10007 + t), participants, &out);
      ASSERT_NO_FATAL_FAILURE(CountDraws(out, r, counts));
    }
    for (auto& [j, c] : counts) {
      uint64_t total = 0;
      for (uint64_t x : c) total += x;
      ASSERT_EQ(total, static_cast<uint64_t>(kTrials)) << "job " << j << " missed rounds";
      if (c.size() < 2) continue;  // a single id is drawn with certainty: nothing to test
      p_values.push_back(ChiSquarePValue(PearsonUniform(c), static_cast<double>(c.size() - 1)));
    }
  }
  ASSERT_GT(p_values.size(), 80u);
  const double per_test = kFamilyAlpha / static_cast<double>(p_values.size());
  for (size_t i = 0; i < p_values.size(); ++i) {
    EXPECT_GE(p_values[i], per_test) << "test " << i << " of " << p_values.size();
  }
}

TEST(DsaStatsTest, ChiSquarePValuesMatchTables) {
  EXPECT_NEAR(ChiSquarePValue(3.841, 1), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquarePValue(23.209, 10), 0.01, 1e-4);
  EXPECT_NEAR(ChiSquarePValue(135.807, 100), 0.01, 1e-4);
  EXPECT_NEAR(BinomialZPValue(5098, 10000, 0.5), 0.05, 1e-3);  // z = 98 / 50 = 1.96
}

// Power: the test must reject Joader's biased draw (a chunk uniformly, then an element), here a
// one-id chunk next to a nine-id chunk, at the same sample count as the real tests.
TEST(DsaStatsTest, ChiSquareRejectsChunkThenElementBias) {
  Rng rng(7);
  std::vector<uint64_t> counts(10, 0);
  for (int t = 0; t < 2000; ++t) ++counts[rng.Uniform(2) == 0 ? 0 : 1 + rng.Uniform(9)];
  EXPECT_LT(ChiSquarePValue(PearsonUniform(counts), 9), 1e-10);
}

TEST(DsaStatsTest, EachDrawIsUniformOverItsRemainingSet) { CheckPerRoundUniformity(false, 1000); }

TEST(DsaStatsTest, UniformityHoldsUnderChurn) { CheckPerRoundUniformity(true, 2000); }

// Theorem 1: in a tree of two jobs, they share with probability |R1∩R2| / max(|R1|, |R2|).
TEST(DsaStatsTest, TwoJobsShareAtTheOptimum) {
  constexpr int kStates = 60;
  constexpr int kTrials = 4000;
  std::vector<double> p_values;
  for (int s = 0; s < kStates; ++s) {
    std::mt19937_64 gen(3000 + s);
    SamplingTree state = RandomState(gen, 2, 16, s % 2 == 1);
    if (state.size() != 2 || state.Nodes()[0].remaining == 0) continue;
    const JobId a = state.JobAt(0), b = state.JobAt(1);
    const Roaring& ra = *state.RemainingSet(a);
    const Roaring& rb = *state.RemainingSet(b);
    const double bound = static_cast<double>(ra.and_cardinality(rb)) /
                         static_cast<double>(std::max(ra.cardinality(), rb.cardinality()));
    const std::vector<JobId> both = {b, a};
    uint64_t shared = 0;
    std::vector<Assignment> out;
    for (int t = 0; t < kTrials; ++t) {
      RoundOnACopy(state, SplitMix64(s * 100003 + t), both, &out);
      shared += out.size() == 1;
    }
    if (bound == 0.0 || bound == 1.0) {
      EXPECT_EQ(shared, bound == 0.0 ? 0u : static_cast<uint64_t>(kTrials)) << "state " << s;
    } else {
      p_values.push_back(BinomialZPValue(shared, kTrials, bound));
    }
  }
  ASSERT_GT(p_values.size(), 30u);
  for (double p : p_values) EXPECT_GE(p, kFamilyAlpha / static_cast<double>(p_values.size()));
}

TEST(DsaStatsTest, IdenticalShareEveryRoundDisjointNever) {
  Roaring same;
  same.addRange(100, 400);
  SamplingTree tree(11);
  for (JobId j = 0; j < 5; ++j) ASSERT_TRUE(tree.AddJob(j, same).ok());
  const std::vector<JobId> all = {4, 2, 0, 1, 3};
  std::vector<Assignment> out;
  for (int i = 0; i < 300; ++i) {
    out.clear();
    tree.RunRound(all, &out);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].jobs.size(), 5u);
  }
  SamplingTree disjoint(12);
  for (JobId j = 0; j < 4; ++j) {
    Roaring r;
    r.addRange(j * 1000, j * 1000 + 50 + 10 * j);
    ASSERT_TRUE(disjoint.AddJob(j, r).ok());
  }
  std::mt19937_64 gen(13);
  for (int i = 0; i < 200; ++i) {
    std::vector<JobId> mask;
    for (JobId j = 0; j < 4; ++j) {
      if (gen() % 3 != 0) mask.push_back(j);
    }
    out.clear();
    disjoint.RunRound(mask, &out);
    for (const Assignment& a : out) ASSERT_EQ(a.jobs.size(), 1u);
  }
}

Roaring Ids(std::initializer_list<std::pair<uint32_t, uint32_t>> ranges) {
  Roaring r;
  for (auto [lo, hi] : ranges) r.addRange(lo, hi);
  return r;
}

// Coupled leaf draws (SamplingTree::CoupledLeafDraw): two jobs whose leaves overlap take one
// sample when they can, and each stays uniform over its R. Two states, one per branch of the
// coupling: the earlier leaf smaller than the later one (x kept with probability a / b), and
// larger (x always kept, the rest of the later leaf by rejection). A third, larger job splits
// both jobs' R into spine {0..4} and leaf. Chi-square per job, and the pair's sharing against
// the exact value of the coupled round.
TEST(DsaStatsTest, CoupledLeafDrawsShareAndStayUniform) {
  struct Case {
    Roaring p, q, r;
    double share;  // P(p and q take one sample), worked out by hand below
  };
  // 1: R_p = {0..9, 20..24} (15), R_q = {0..9, 30..39} (20), R_r = {0..4, 100..199}.
  //    S_p = S_q = {0..4}, L_p = {5..9, 20..24} (a = 10), L_q = {5..9, 30..39} (b = 15), N_q empty.
  //    p spine (5/15): q follows with 15/20. p leaf (10/15): q's leaf keeps x in {5..9} (5/10)
  //    with a/b = 10/15. Share = 1/3 * 3/4 + 2/3 * 1/2 * 2/3 = 1/4 + 2/9.
  // 2: R_p = {0..9, 20..29} (20), R_q = {0..9, 30..33, 100..109} (24), R_r as above.
  //    S_p = {0..4}, L_p = {5..9, 20..29} (a = 15); S_q = {0..4, 100..109}, N_q = {100..109},
  //    L_q = {5..9, 30..33} (b = 9). p spine (5/20): q follows with 20/24. p leaf (15/20): q
  //    takes its spine with 10/19 (c = 10, w = 24 - 5), else its leaf keeps x in {5..9} (5/15).
  //    Share = 1/4 * 5/6 + 3/4 * 9/19 * 1/3.
  const Roaring r = Ids({{0, 5}, {100, 200}});
  const std::vector<Case> cases = {
      {Ids({{0, 10}, {20, 25}}), Ids({{0, 10}, {30, 40}}), r, 1.0 / 4 + 2.0 / 9},
      {Ids({{0, 10}, {20, 30}}), Ids({{0, 10}, {30, 34}, {100, 110}}), r,
       1.0 / 4 * 5 / 6 + 3.0 / 4 * 9 / 19 / 3},
  };
  constexpr int kTrials = 40000;
  std::vector<double> p_values;
  for (size_t c = 0; c < cases.size(); ++c) {
    SamplingTree state(31);
    ASSERT_TRUE(state.AddJob(0, cases[c].p).ok());
    ASSERT_TRUE(state.AddJob(1, cases[c].q).ok());
    ASSERT_TRUE(state.AddJob(2, cases[c].r).ok());
    const std::vector<JobId> pair = {1, 0};  // r is masked: it only shapes the tree
    std::map<JobId, std::vector<SampleId>> ids;
    std::map<JobId, std::vector<uint64_t>> counts;
    for (JobId j : pair) {
      for (uint32_t x : *state.RemainingSet(j)) ids[j].push_back(x);
      counts[j].assign(ids[j].size(), 0);
    }
    uint64_t shared = 0;
    std::vector<Assignment> out;
    for (int t = 0; t < kTrials; ++t) {
      RoundOnACopy(state, SplitMix64(c * 1000003 + t), pair, &out);
      shared += out.size() == 1;
      ASSERT_NO_FATAL_FAILURE(CountDraws(out, ids, counts));
    }
    for (auto& [j, cells] : counts) {
      p_values.push_back(
          ChiSquarePValue(PearsonUniform(cells), static_cast<double>(cells.size() - 1)));
    }
    p_values.push_back(BinomialZPValue(shared, kTrials, cases[c].share));
  }
  for (size_t i = 0; i < p_values.size(); ++i) {
    EXPECT_GE(p_values[i], kFamilyAlpha / static_cast<double>(p_values.size())) << "test " << i;
  }
}

// Before the coupled leaf draws, two jobs on one dataset shared only 90% of the rounds beside a
// job on a disjoint one (once that job's epoch restarted it sorted last and emptied their spine)
// and 52% in an Optuna sweep's mix of subsets: they now share every round.
TEST(DsaStatsTest, IdenticalJobsShareEveryRoundBesideOtherSubsets) {
  const Roaring same = Ids({{0, 300}});
  const Roaring disjoint = Ids({{1000, 1200}});
  const Roaring partial = Ids({{0, 150}, {500, 700}});  // half of `same`, and more
  SamplingTree tree(41);
  ASSERT_TRUE(tree.AddJob(0, same).ok());
  ASSERT_TRUE(tree.AddJob(1, same).ok());
  ASSERT_TRUE(tree.AddJob(2, disjoint).ok());
  ASSERT_TRUE(tree.AddJob(3, partial).ok());
  const std::vector<JobId> all = {3, 1, 2, 0};
  std::vector<Assignment> out;
  for (int i = 0; i < 900; ++i) {  // three epochs of the identical pair
    for (JobId j = 0; j < 4; ++j) {
      if (tree.EpochDone(j)) {
        ASSERT_TRUE(tree.ResetEpoch(j).ok());
      }
    }
    out.clear();
    tree.RunRound(all, &out);
    bool together = false;
    for (const Assignment& a : out) {
      const bool has0 = std::count(a.jobs.begin(), a.jobs.end(), 0u) > 0;
      const bool has1 = std::count(a.jobs.begin(), a.jobs.end(), 1u) > 0;
      ASSERT_EQ(has0, has1) << "round " << i << ": the identical jobs split";
      together |= has0;
    }
    ASSERT_TRUE(together) << "round " << i;
  }
}

// A documented limit of the DSA as specified: with a third job masked out, two participants share
// only through the spine nodes, which split R1∩R2 by the masked job. Here R_a = {1,2},
// R_c = {1,5,6} (masked), R_b = {1,2,7,8}: they share with probability 1/4 + 1/2·1/3 = 5/12,
// below the two-job optimum 2/4.
TEST(DsaStatsTest, MaskedThirdJobLowersPairSharing) {
  SamplingTree state(21);
  ASSERT_TRUE(state.AddJob(0, Roaring::bitmapOf(2, 1, 2)).ok());
  ASSERT_TRUE(state.AddJob(1, Roaring::bitmapOf(3, 1, 5, 6)).ok());
  ASSERT_TRUE(state.AddJob(2, Roaring::bitmapOf(4, 1, 2, 7, 8)).ok());
  constexpr int kTrials = 20000;
  uint64_t shared = 0;
  std::vector<Assignment> out;
  const std::vector<JobId> pair = {0, 2};
  for (int t = 0; t < kTrials; ++t) {
    RoundOnACopy(state, SplitMix64(t), pair, &out);
    shared += out.size() == 1;
  }
  EXPECT_GE(BinomialZPValue(shared, kTrials, 5.0 / 12), kFamilyAlpha);
  EXPECT_LT(BinomialZPValue(shared, kTrials, 0.5), 1e-9);
}

// counts[k][x]: how often position k of an epoch held id x. Each position's row is uniform
// (chi-square, Bonferroni over the positions).
void ExpectEveryPositionUniform(const std::vector<std::vector<uint64_t>>& counts) {
  const double ids = static_cast<double>(counts.size());
  for (size_t k = 0; k < counts.size(); ++k) {
    EXPECT_GE(ChiSquarePValue(PearsonUniform(counts[k]), ids - 1), kFamilyAlpha / ids)
        << "position " << k;
  }
}

// Churn across whole epochs: while other jobs join, leave and restart, the position at which job 0
// meets each of its 8 ids is uniform (chi-square per position, Bonferroni over the 8 positions).
TEST(DsaStatsTest, PermutationsStayUniformUnderChurn) {
  constexpr uint32_t kIds = 8;
  constexpr int kEpochs = 3000;
  std::mt19937_64 gen(4242);
  SamplingTree tree(4243);
  Roaring mine;
  mine.addRange(0, kIds);
  ASSERT_TRUE(tree.AddJob(0, mine).ok());
  std::vector<JobId> others;
  JobId next = 1;
  std::vector<std::vector<uint64_t>> counts(kIds, std::vector<uint64_t>(kIds, 0));
  uint32_t step = 0;
  std::vector<Assignment> out;
  for (int epoch = 0; epoch < kEpochs;) {
    if (gen() % 5 == 0 && others.size() < 4) {
      ASSERT_TRUE(tree.AddJob(next, RandomSubset(gen, 2 * kIds, 0.5)).ok());
      others.push_back(next++);
    } else if (gen() % 5 == 0 && !others.empty()) {
      const size_t i = gen() % others.size();
      ASSERT_TRUE(tree.RemoveJob(others[i]).ok());
      others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::vector<JobId> mask;
    if (gen() % 4 != 0) mask.push_back(0);
    for (JobId j : others) {
      if (gen() % 2) mask.push_back(j);
    }
    out.clear();
    tree.RunRound(mask, &out);
    for (const Assignment& a : out) {
      if (std::find(a.jobs.begin(), a.jobs.end(), 0u) != a.jobs.end()) ++counts[step++][a.sample];
    }
    for (JobId j : others) {
      if (tree.EpochDone(j)) {
        ASSERT_TRUE(tree.ResetEpoch(j).ok());
      }
    }
    if (tree.EpochDone(0)) {
      ASSERT_EQ(step, kIds);
      step = 0;
      ++epoch;
      ASSERT_TRUE(tree.ResetEpoch(0).ok());
    }
  }
  ExpectEveryPositionUniform(counts);
}

// Issue 10 item 4: a job killed at random steps and resumed in a new tree (a restarted server,
// with a new seed and a partner job re-added) from the samples it had taken still draws every
// position of its epoch uniformly, and sees each sample exactly once.
TEST(DsaStatsTest, ResumedEpochsStayUniformOverRestartsAtRandomSteps) {
  constexpr uint32_t kIds = 8;
  constexpr int kEpochs = 4000;
  std::mt19937_64 gen(777);
  Roaring mine;
  mine.addRange(0, kIds);
  std::vector<std::vector<uint64_t>> counts(kIds, std::vector<uint64_t>(kIds, 0));
  uint64_t restarts = 0;
  std::vector<Assignment> out;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    Roaring taken;
    std::vector<uint32_t> order;
    while (taken.cardinality() < kIds) {
      // A new server: a new seed, the job resumed from what it took, a partner that shares.
      SamplingTree tree(gen());
      const Roaring remaining = mine - taken;
      ASSERT_TRUE(tree.AddJob(0, mine, remaining).ok());
      ASSERT_TRUE(tree.AddJob(1, RandomSubset(gen, 2 * kIds, 0.5) | Roaring::bitmapOf(1, 0)).ok());
      // Dies after a random number of its draws (maybe none); the last life runs to the end.
      const uint64_t lives_left = gen() % 3;
      const uint64_t draws = lives_left == 0 ? kIds : gen() % (remaining.cardinality() + 1);
      if (lives_left != 0) ++restarts;
      for (uint64_t d = 0; d < draws && !tree.EpochDone(0);) {
        out.clear();
        const JobId both[] = {0, 1};
        tree.RunRound(gen() % 3 == 0 ? std::span<const JobId>(both, 1) : both, &out);
        for (const Assignment& a : out) {
          if (std::find(a.jobs.begin(), a.jobs.end(), 0u) == a.jobs.end()) continue;
          ASSERT_FALSE(taken.contains(a.sample)) << "sample " << a.sample << " twice";
          taken.add(a.sample);
          order.push_back(a.sample);
          ++d;
        }
        if (tree.EpochDone(1)) {
          ASSERT_TRUE(tree.ResetEpoch(1).ok());
        }
      }
    }
    ASSERT_EQ(order.size(), kIds);
    for (uint32_t k = 0; k < kIds; ++k) ++counts[k][order[k]];
  }
  EXPECT_GT(restarts, kEpochs / 2u);
  ExpectEveryPositionUniform(counts);
}

// Job 0's epochs over 8 ids beside a partner, with its drawn, undelivered queue cut at times and
// the tail returned (Return), as a scheduler does when another job joins. `cut(queue, gen)` says
// how many entries to keep. counts[k][x]: epochs whose position k held id x. Checks that every
// epoch meets each id exactly once and that cuts gave draws back.
std::vector<std::vector<uint64_t>> PositionsWithTailsGoingBack(
    const std::function<size_t(const std::vector<uint32_t>&, std::mt19937_64&)>& cut) {
  constexpr uint32_t kIds = 8;
  constexpr int kEpochs = 4000;
  std::mt19937_64 gen(9090);
  SamplingTree tree(9091);
  EXPECT_TRUE(tree.AddJob(0, Roaring::bitmapOf(8, 0, 1, 2, 3, 4, 5, 6, 7)).ok());
  EXPECT_TRUE(tree.AddJob(1, RandomSubset(gen, 2 * kIds, 0.5) | Roaring::bitmapOf(1, 0)).ok());
  std::vector<std::vector<uint64_t>> counts(kIds, std::vector<uint64_t>(kIds, 0));
  std::vector<uint32_t> queue, order;  // drawn, not delivered; delivered this epoch
  uint64_t returned = 0;
  std::vector<Assignment> out;
  for (int epoch = 0; epoch < kEpochs;) {
    const uint64_t step = gen() % 4;
    if (step == 0 && !queue.empty()) {
      const size_t keep = std::min(queue.size(), cut(queue, gen));
      Roaring back;
      for (size_t i = keep; i < queue.size(); ++i) back.add(queue[i]);
      EXPECT_TRUE(tree.Return(0, back).ok());
      returned += queue.size() - keep;
      queue.resize(keep);
    } else if (step == 1 && !queue.empty()) {  // deliveries from the front
      const size_t n = 1 + gen() % queue.size();
      order.insert(order.end(), queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
      queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
    } else {
      out.clear();
      const JobId both[] = {0, 1};
      tree.RunRound(gen() % 3 == 0 ? std::span<const JobId>(both, 1) : both, &out);
      for (const Assignment& a : out) {
        if (std::find(a.jobs.begin(), a.jobs.end(), 0u) != a.jobs.end()) queue.push_back(a.sample);
      }
      if (tree.EpochDone(1)) {
        EXPECT_TRUE(tree.ResetEpoch(1).ok());
      }
    }
    if (tree.EpochDone(0) && queue.empty()) {
      EXPECT_EQ(order.size(), kIds);
      Roaring seen;
      for (uint32_t x : order) {
        EXPECT_FALSE(seen.contains(x)) << "sample " << x << " twice in an epoch";
        seen.add(x);
      }
      for (uint32_t k = 0; k < kIds && k < order.size(); ++k) ++counts[k][order[k]];
      order.clear();
      ++epoch;
      EXPECT_TRUE(tree.ResetEpoch(0).ok());
    }
  }
  EXPECT_GT(returned, uint64_t{kEpochs}) << "the cuts must give draws back";
  return counts;
}

// Cuts at positions drawn without looking at the ids: every position stays uniform.
TEST(DsaStatsTest, PermutationsStayUniformWhenTailsGoBack) {
  ExpectEveryPositionUniform(PositionsWithTailsGoingBack(
      [](const std::vector<uint32_t>& queue, std::mt19937_64& gen) {
        return static_cast<size_t>(gen() % queue.size());
      }));
}

// The negative control: a cut that looks at the ids (give back from id 0 on, when queued) makes
// id 0 come late, and the same test sees it.
TEST(DsaStatsTest, ACutChosenByTheIdsIsCaught) {
  const std::vector<std::vector<uint64_t>> counts = PositionsWithTailsGoingBack(
      [](const std::vector<uint32_t>& queue, std::mt19937_64&) {
        const auto it = std::find(queue.begin(), queue.end(), 0u);
        return static_cast<size_t>(it - queue.begin());  // the whole queue when 0 is absent
      });
  EXPECT_LT(ChiSquarePValue(PearsonUniform(counts[0]), 7), kFamilyAlpha / 8)
      << "position 0 must be biased against id 0";
}

TEST(SamplingTreeReturnTest, RejectsSamplesOutsideTheDatasetOrStillInR) {
  SamplingTree tree(1);
  Roaring d;
  d.addRange(0, 10);
  ASSERT_TRUE(tree.AddJob(0, d).ok());
  std::vector<Assignment> out;
  const JobId one[] = {0};
  tree.RunRound(one, &out);
  ASSERT_EQ(out.size(), 1u);
  const uint32_t drawn = out[0].sample;
  EXPECT_EQ(tree.Return(7, Roaring::bitmapOf(1, drawn)).code(), StatusCode::kNotFound);
  const Status outside = tree.Return(0, Roaring::bitmapOf(2, drawn, 12));
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("1 outside its dataset"), std::string::npos)
      << outside.ToString();
  EXPECT_EQ(tree.Return(0, Roaring::bitmapOf(1, (drawn + 1) % 10)).code(),
            StatusCode::kInvalidArgument)
      << "a sample still in R cannot go back";
  EXPECT_EQ(tree.Remaining(0), 9u);
  ASSERT_TRUE(tree.Return(0, Roaring::bitmapOf(1, drawn)).ok());
  EXPECT_EQ(tree.Remaining(0), 10u);
}

TEST(SamplingTreeResumeTest, RejectsARemainderOutsideTheDataset) {
  SamplingTree tree(1);
  Roaring d;
  d.addRange(0, 10);
  EXPECT_EQ(tree.AddJob(0, d, Roaring()).code(), StatusCode::kInvalidArgument);
  const Status outside = tree.AddJob(0, d, Roaring::bitmapOf(3, 2, 3, 12));
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("1 of the left ones outside it"), std::string::npos)
      << outside.ToString();
  ASSERT_TRUE(tree.AddJob(0, d, Roaring::bitmapOf(3, 2, 3, 7)).ok());
  EXPECT_EQ(tree.Remaining(0), 3u);
}

}  // namespace
}  // namespace carpool
