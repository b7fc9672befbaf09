// Differential tests of the sampling tree against the from-scratch reference, and the
// permutation property (each job gets each id of its dataset exactly once per epoch).
#include "sampler/sampling_tree.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "sampler/reference_tree.h"

namespace carpool {
namespace {

using testing::ComputeReferenceNodes;
using testing::SampleSet;
using testing::ToSet;

Roaring RandomDataset(std::mt19937_64& gen, uint32_t universe, double density, uint32_t stride) {
  Roaring r;
  std::bernoulli_distribution keep(density);
  for (uint32_t i = 0; i < universe; ++i) {
    if (keep(gen)) r.add(i * stride);
  }
  if (r.isEmpty()) r.add(0);
  return r;
}

// Mirrors the tree with explicit sets and checks every round and every node against it.
class Mirror {
 public:
  explicit Mirror(SamplingTree* tree) : tree_(tree) {}

  void Add(JobId id, const Roaring& dataset) {
    ASSERT_TRUE(tree_->AddJob(id, dataset).ok());
    datasets_[id] = ToSet(dataset);
    r_[id] = datasets_[id];
  }
  void Remove(JobId id) {
    ASSERT_TRUE(tree_->RemoveJob(id).ok());
    datasets_.erase(id);
    r_.erase(id);
  }
  void Reset(JobId id) {
    ASSERT_TRUE(tree_->ResetEpoch(id).ok());
    r_[id] = datasets_[id];
  }
  // Takes a random part of the job's R without a round (a follower's steps).
  void Take(JobId id, std::mt19937_64& gen) {
    Roaring part;
    for (uint32_t x : r_[id]) {
      if (gen() % 3 == 0) part.add(x);
    }
    ASSERT_TRUE(tree_->Take(id, part).ok());
    for (uint32_t x : part) r_[id].erase(x);
  }
  // Runs a round and checks: each participant with a non-empty R got exactly one sample of its
  // R, nobody else got one, and each Assignment lists distinct jobs.
  void Round(const std::vector<JobId>& participants) {
    std::set<JobId> want;
    for (JobId j : participants) {
      if (r_.count(j) && !r_[j].empty()) want.insert(j);
    }
    std::vector<Assignment> out;
    tree_->RunRound(participants, &out);
    std::map<JobId, int> got;
    std::set<SampleId> samples;
    for (const Assignment& a : out) {
      ASSERT_TRUE(samples.insert(a.sample).second) << "sample " << a.sample << " listed twice";
      for (JobId j : a.jobs) {
        ++got[j];
        ASSERT_TRUE(r_.count(j)) << "assignment to unknown job " << j;
        ASSERT_EQ(r_[j].erase(a.sample), 1u) << "job " << j << " got " << a.sample << " twice";
      }
    }
    for (JobId j : want) EXPECT_EQ(got[j], 1) << "job " << j;
    EXPECT_EQ(got.size(), want.size());
  }
  void Check() const {
    auto ref = ComputeReferenceNodes(r_);
    ASSERT_EQ(tree_->size(), ref.order.size());
    for (size_t p = 0; p < ref.order.size(); ++p) {
      ASSERT_EQ(tree_->JobAt(p), ref.order[p]) << "position " << p;
      ASSERT_EQ(ToSet(tree_->SpineAt(p)), ref.spine[p]) << "spine at " << p;
      ASSERT_EQ(ToSet(tree_->LeafAt(p)), ref.leaf[p]) << "leaf at " << p;
      ASSERT_EQ(ToSet(*tree_->RemainingSet(ref.order[p])), r_.at(ref.order[p]));
      auto stats = tree_->Nodes()[p];
      ASSERT_EQ(stats.spine, ref.spine[p].size());
      ASSERT_EQ(stats.leaf, ref.leaf[p].size());
      ASSERT_EQ(stats.remaining, r_.at(ref.order[p]).size());
    }
  }
  const std::map<JobId, SampleSet>& r() const { return r_; }

 private:
  SamplingTree* tree_;
  std::map<JobId, SampleSet> datasets_;
  std::map<JobId, SampleSet> r_;
};

TEST(SamplingTreeTest, RejectsBadJobs) {
  SamplingTree tree(1);
  Roaring ds = Roaring::bitmapOf(3, 1, 2, 3);
  EXPECT_TRUE(tree.AddJob(7, ds).ok());
  Status dup = tree.AddJob(7, ds);
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find("job 7"), std::string::npos);
  EXPECT_EQ(tree.AddJob(8, Roaring()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tree.RemoveJob(9).code(), StatusCode::kNotFound);
  EXPECT_EQ(tree.ResetEpoch(9).code(), StatusCode::kNotFound);
  EXPECT_EQ(tree.Remaining(9), 0u);
  EXPECT_FALSE(tree.EpochDone(9));
  EXPECT_EQ(tree.RemainingSet(9), nullptr);
  EXPECT_TRUE(tree.RemoveJob(7).ok());
  EXPECT_FALSE(tree.Contains(7));
}

// Datasets from the catalog are run-compressed; the tree converts runs (small ones to arrays,
// large ones to bitsets) and must still hand out exactly the dataset.
TEST(SamplingTreeTest, AcceptsRunCompressedDatasets) {
  Roaring ds;
  ds.addRange(10, 110);        // a small run: becomes an array container
  ds.addRange(70000, 200000);  // full and partial runs: become bitset containers
  ds.runOptimize();
  SamplingTree tree(3);
  ASSERT_TRUE(tree.AddJob(1, ds).ok());
  EXPECT_TRUE(*tree.RemainingSet(1) == ds);
  std::vector<Assignment> out;
  const std::vector<JobId> one = {1};
  for (uint64_t i = 0; i < ds.cardinality(); ++i) tree.RunRound(one, &out);
  Roaring got;
  for (const Assignment& a : out) got.add(a.sample);
  EXPECT_EQ(out.size(), ds.cardinality());
  EXPECT_TRUE(got == ds);
  EXPECT_TRUE(tree.EpochDone(1));
}

// Random sequences of masked rounds, adds, removes and epoch resets; the incremental nodes must
// equal the from-scratch definition after every operation.
TEST(SamplingTreeTest, IncrementalNodesMatchReference) {
  uint64_t swaps = 0, rounds = 0, adds = 0, removes = 0, resets = 0, takes = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 gen(seed);
    SamplingTree tree(seed);
    Mirror m(&tree);
    const uint32_t universe = 10 + static_cast<uint32_t>(gen() % 40);
    const uint32_t stride = (seed % 3 == 0) ? 70001 : 1;  // spread over roaring containers
    JobId next_id = 0;
    std::vector<Roaring> pool;  // shared datasets, so identical and nested R's occur
    for (int op = 0; op < 300; ++op) {
      const uint64_t dice = gen() % 100;
      const size_t n = m.r().size();
      if (n == 0 || (dice < 10 && n < 7)) {
        if (pool.empty() || gen() % 2) {
          pool.push_back(RandomDataset(gen, universe, 0.2 + 0.7 * (gen() % 100) / 100.0, stride));
        }
        m.Add(next_id++, pool[gen() % pool.size()]);
        ++adds;
      } else if (dice < 16) {
        auto it = m.r().begin();
        std::advance(it, gen() % n);
        m.Remove(it->first);
        ++removes;
      } else if (dice < 24) {
        auto it = m.r().begin();
        std::advance(it, gen() % n);
        m.Reset(it->first);
        ++resets;
      } else if (dice < 32) {
        auto it = m.r().begin();
        std::advance(it, gen() % n);
        m.Take(it->first, gen);
        ++takes;
      } else {
        std::vector<JobId> participants;
        for (const auto& [id, set] : m.r()) {
          if (gen() % 3 != 0) participants.push_back(id);
        }
        std::shuffle(participants.begin(), participants.end(), gen);
        m.Round(participants);
        ++rounds;
      }
      m.Check();
      if (::testing::Test::HasFatalFailure()) return;
    }
    swaps += tree.swaps();
  }
  // The sequences must have exercised every path, adjacent swaps included.
  EXPECT_GT(swaps, 1000u);
  EXPECT_GT(rounds, 5000u);
  EXPECT_GT(adds, 500u);
  EXPECT_GT(removes, 200u);
  EXPECT_GT(resets, 300u);
  EXPECT_GT(takes, 300u);
}

// Sizes that cross under masks force adjacent swaps; each swap must equal a rebuild, including
// swaps with the last position and between equal sizes ordered by id.
TEST(SamplingTreeTest, AdjacentSwapsEqualRebuild) {
  SamplingTree tree(5);
  Mirror m(&tree);
  m.Add(4, Roaring::bitmapOf(6, 0, 1, 2, 3, 4, 5));
  m.Add(2, Roaring::bitmapOf(6, 0, 1, 2, 3, 10, 11));
  m.Add(3, Roaring::bitmapOf(6, 0, 1, 4, 5, 10, 12));
  m.Add(1, Roaring::bitmapOf(5, 0, 2, 4, 10, 12));
  m.Check();
  const std::vector<std::vector<JobId>> masks = {{1}, {4, 3}, {2}, {1, 2}, {4}, {3}, {1, 3}};
  uint64_t before = tree.swaps();
  for (const auto& mask : masks) {
    m.Round(mask);
    m.Check();
  }
  EXPECT_GT(tree.swaps(), before + 3);
}

TEST(SamplingTreeTest, EveryJobGetsItsDatasetOncePerEpoch) {
  for (uint64_t seed = 100; seed < 106; ++seed) {
    std::mt19937_64 gen(seed);
    SamplingTree tree(seed);
    const int kJobs = 5, kEpochs = 3;
    std::vector<Roaring> ds;
    for (int j = 0; j < kJobs; ++j) {
      // Several thousand ids per container, so array, bitmap and run containers all occur.
      Roaring r = RandomDataset(gen, 6000, 0.5 + 0.1 * j, j % 2 ? 13 : 1);
      if (j == 4) r.runOptimize();
      ds.push_back(r);
      ASSERT_TRUE(tree.AddJob(j, ds[j]).ok());
    }
    std::vector<int> epoch(kJobs, 0);
    std::vector<SampleSet> seen(kJobs);
    std::vector<Assignment> out;
    std::vector<JobId> live = {0, 1, 2, 3, 4};
    while (!live.empty()) {
      std::vector<JobId> participants;
      for (JobId j : live) {
        if (gen() % 4 != 0) participants.push_back(j);
      }
      out.clear();
      tree.RunRound(participants, &out);
      for (const Assignment& a : out) {
        for (JobId j : a.jobs) {
          ASSERT_TRUE(ds[j].contains(a.sample));
          ASSERT_TRUE(seen[j].insert(a.sample).second) << "job " << j << " epoch " << epoch[j];
        }
      }
      for (size_t i = 0; i < live.size();) {
        JobId j = live[i];
        if (!tree.EpochDone(j)) {
          ++i;
          continue;
        }
        ASSERT_EQ(seen[j], ToSet(ds[j])) << "job " << j << " epoch " << epoch[j];
        seen[j].clear();
        if (++epoch[j] == kEpochs) {
          ASSERT_TRUE(tree.RemoveJob(j).ok());
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ASSERT_TRUE(tree.ResetEpoch(j).ok());
          ++i;
        }
      }
    }
    EXPECT_EQ(tree.size(), 0u);
  }
}

}  // namespace
}  // namespace carpool
