// The dependent sampling tree and the DSA round, as specified in docs/architecture.md ("The
// sampling tree and a DSA round") after the Joader paper. Pure computation: no I/O, no threads.
// Thread-compatible: callers serialize access.
//
// Jobs are kept in positions 0..n-1, ascending by |R_j| and then by job id. With
// S_p = R_p ∩ R_{p+1} ∩ … ∩ R_{n-1} (the suffix intersection), the tree holds
//   spine node N_p = S_p \ S_{p-1}   (S_{-1} = {}; this equals the specification's N_p)
//   leaf       L_p = R_p \ S_p       (L_{n-1} = {})
// so that R_p is the disjoint union N_0 ∪ … ∪ N_p ∪ L_p. Every node is a roaring bitmap with its
// size kept alongside. The working bitmaps hold no run containers (see roaring_node.h).
//
// Randomness: one seeded generator drives every decision, so a job's permutation of its dataset
// depends on which other jobs exist and when rounds run; it is still uniform for every job.
#ifndef CARPOOL_SAMPLER_SAMPLING_TREE_H_
#define CARPOOL_SAMPLER_SAMPLING_TREE_H_

#include <cstdint>
#include <roaring/roaring.hh>
#include <span>
#include <unordered_map>
#include <vector>

#include "carpool/status.h"
#include "sampler/rng.h"

namespace carpool {

using JobId = uint32_t;
using SampleId = uint32_t;

// One sample of a round and the jobs that share it. Each job appears in at most one Assignment
// of a round, and no two Assignments of a round have the same sample.
struct Assignment {
  SampleId sample;
  std::vector<JobId> jobs;
  // Set by the scheduler for a follower's copy of its leader's draw from an earlier round
  // (docs/scheduler.md "Following a running job"): shared, though decided in a later round.
  bool followed = false;
};

class SamplingTree {
 public:
  // Sizes of one position of the tree, for stats (`carpool status`) and tests.
  struct NodeStats {
    JobId job;
    uint64_t remaining;  // |R_job|
    uint64_t spine;      // |N_p|
    uint64_t leaf;       // |L_p|
  };

  explicit SamplingTree(uint64_t seed);

  // Inserts a job with R = dataset. Errors: the id is already present, or the dataset is empty.
  // Cost: O(p) bitmap operations, p = the job's new position.
  Status AddJob(JobId job, const Roaring& dataset);
  // A job resumed mid-epoch: R = `remaining`, a non-empty subset of `dataset` (the epoch's samples
  // not yet taken); later epochs use the whole dataset. Errors as above, and InvalidArgument when
  // `remaining` is empty or not inside `dataset`.
  Status AddJob(JobId job, const Roaring& dataset, const Roaring& remaining);
  // Removes a job and its R. Error: unknown id. Cost: O(p) bitmap operations.
  Status RemoveJob(JobId job);
  // Starts a new epoch: R = dataset again (a removal followed by an insertion). Error: unknown id.
  Status ResetEpoch(JobId job);
  // Puts samples the job had drawn back into its R, undoing draws it has not used (the scheduler
  // re-deciding a queue's tail so that a job joining shares it). Its permutation stays uniform
  // when which draws go back depends only on their positions, never on the samples.
  // Errors: unknown id; InvalidArgument when a sample is outside the dataset or already in R.
  // Cost: a removal and an insertion, O(p) bitmap operations.
  Status Return(JobId job, const Roaring& samples);
  // Removes samples from the job's R without a round: the scheduler's follower takes its
  // leader's draws this way. The caller answers for the follower's permutation staying uniform.
  // Errors: unknown id; InvalidArgument when a sample is not in R.
  // Cost: O(p) bitmap lookups per sample, plus one adjacent swap per job it passes in the order.
  Status Take(JobId job, const Roaring& samples);

  // Runs one DSA round over `participants`: any subset of the jobs, in any order. Unknown ids,
  // duplicates and jobs whose R is empty are skipped. Each remaining participant is assigned
  // exactly one sample of its R, uniformly at random; the samples are removed from the R's and
  // the tree re-sorted. Appends one Assignment per distinct sample of the round to `out`.
  // Cost: O(n) node operations plus O(n) per assigned sample, plus one adjacent swap (O(1) node
  // operations) per pair of jobs whose order changed.
  void RunRound(std::span<const JobId> participants, std::vector<Assignment>* out);

  bool Contains(JobId job) const { return index_.count(job) != 0; }
  // |R_job|; 0 for an unknown job.
  uint64_t Remaining(JobId job) const;
  // True when the job's R is empty (its epoch is over). False for an unknown job.
  bool EpochDone(JobId job) const { return Contains(job) && Remaining(job) == 0; }
  // R_job itself (valid until the next mutation), or nullptr for an unknown job.
  const Roaring* RemainingSet(JobId job) const;
  size_t size() const { return jobs_.size(); }

  // Per position, ascending: the job and its node sizes.
  std::vector<NodeStats> Nodes() const;
  // Introspection by position, for tests and debugging. REQUIRES: pos < size().
  JobId JobAt(size_t pos) const { return jobs_[pos].id; }
  const Roaring& SpineAt(size_t pos) const { return spine_[pos]; }
  const Roaring& LeafAt(size_t pos) const { return jobs_[pos].leaf; }

  // Adjacent swaps done so far (a measure of re-sorting work).
  uint64_t swaps() const { return swaps_; }
  // Re-seeds the generator, e.g. to draw many independent rounds from copies of one state.
  void Reseed(uint64_t seed) { rng_.Seed(seed); }

 private:
  struct Job {
    JobId id;
    Roaring dataset;
    Roaring remaining;  // R
    Roaring leaf;       // L at this job's position
    uint64_t size = 0;  // |R|
    uint64_t leaf_size = 0;
  };
  // One draw of a round, applied after all draws (the round works on the state at its start).
  struct Draw {
    SampleId sample;
    int32_t spine;          // node it came from, or -1 for the leaf of takers_[first]
    uint32_t first, count;  // its takers: taker_pos_[first, first + count)
  };

  bool Before(const Job& a, const Job& b) const {
    return a.size != b.size ? a.size < b.size : a.id < b.id;
  }
  // First position whose job orders after `job` (where `job` would be inserted).
  size_t InsertPosition(const Job& job) const;
  Status Insert(Job job);
  Job Erase(size_t pos);
  // Recomputes spine_[0..top] and the leaves of positions 0..top, given S_top.
  void RebuildDown(size_t top, Roaring s_top);
  // Union of spine_[0..last] (= S_last).
  Roaring SpineUnion(size_t last) const;
  // Swaps the jobs at positions p and p+1, touching only N_{p+1}, N_{p+2}, L_p and L_{p+1}.
  void SwapAdjacent(size_t p);
  void ApplyDraw(const Draw& d);
  // Take's move of one sample x of the R of the job at position p (no re-sort).
  void TakeOne(size_t p, SampleId x);
  // The leaf draw of position q in a round whose latest leaf draw was x, at position p:
  // uniform over L_q, and x itself with the highest probability that allows,
  // |L_p ∩ L_q| / max(|L_p|, |L_q|) over x's draw (a maximal coupling). Nothing else in the round
  // depends on which sample a leaf draw takes, so every job stays uniform over its R; two jobs on
  // one dataset then take the same sample even where a third job's set splits their R into spine
  // and leaf (docs/design-departures.md). O(1) expected.
  SampleId CoupledLeafDraw(size_t p, SampleId x, size_t q);
  void Resort();

  Rng rng_;
  std::vector<Job> jobs_;       // by position
  std::vector<Roaring> spine_;  // N_p by position
  std::vector<uint64_t> spine_size_;
  std::unordered_map<JobId, size_t> index_;  // job id -> position
  uint64_t swaps_ = 0;
  // Scratch space of RunRound, kept to avoid allocations.
  std::vector<uint8_t> in_round_;
  std::vector<uint32_t> group_;
  std::vector<uint32_t> taker_pos_;
  std::vector<Draw> draws_;
};

}  // namespace carpool

#endif  // CARPOOL_SAMPLER_SAMPLING_TREE_H_
