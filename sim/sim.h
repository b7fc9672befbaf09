// The simulation behind `carpool sim`: the sampler without I/O. Jobs join at their start round,
// take part in each round with probability `speed`, run E epochs and leave. Pure computation.
// Thread-compatible: callers serialize access.
//
// The loop is split so that a later driver (a cache and a scheduler with look-ahead) can choose
// the participants itself and observe each round:
//   while (!sim.Done()) {
//     sim.BeginRound();                          // joins the jobs whose start has come
//     auto participants = sim.DrawParticipants();  // or a scheduler's choice
//     stats.BeforeRound(participants);           // reads the R's before the round
//     const RoundRecord& r = sim.FinishRound(participants);
//     stats.AfterRound(r);                       // and a trace, a cache, ...
//   }
#ifndef CARPOOL_SIM_SIM_H_
#define CARPOOL_SIM_SIM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <roaring/roaring.hh>
#include <span>
#include <string>
#include <vector>

#include "carpool/status.h"
#include "sampler/rng.h"
#include "sampler/sampling_tree.h"

namespace carpool {

struct SimJob {
  std::string name;
  Roaring dataset;
  uint64_t start = 0;  // the round at which the job joins
  double speed = 1.0;  // probability of taking part in a round, in (0, 1]
  uint64_t epochs = 0;  // epochs this job runs; 0: SimOptions::epochs
};

struct SimOptions {
  uint64_t epochs = 1;  // each job runs this many epochs (unless it sets its own), then leaves
  uint64_t seed = 1;    // seeds the tree and, through splitmix64, the participation coins
};

// What one round did. Job ids are indexes into Simulation::jobs().
struct RoundRecord {
  uint64_t round = 0;
  std::vector<JobId> joined;        // jobs that joined just before this round
  std::vector<JobId> participants;  // live jobs that took part, ascending
  std::vector<Assignment> assignments;
  std::vector<uint64_t> epoch;    // per job: the (0-based) epoch its samples of this round are in
  std::vector<JobId> epoch_ends;  // jobs that finished an epoch in this round
  std::vector<JobId> left;        // jobs that finished their last epoch and left
};

class Simulation {
 public:
  // InvalidArgument for: no jobs, duplicate names, an empty dataset, a speed outside (0, 1],
  // zero epochs.
  static Result<std::unique_ptr<Simulation>> Create(std::vector<SimJob> jobs, SimOptions options);

  // True when every job has left.
  bool Done() const { return left_ == jobs_.size(); }
  // The round that BeginRound/FinishRound work on next.
  uint64_t round() const { return round_; }

  // Joins the jobs whose start has come; when no job is live, first skips ahead to the next start.
  void BeginRound();
  // The default participation: each live job independently with probability `speed`.
  std::vector<JobId> DrawParticipants();
  // Runs the DSA round over `participants` (jobs that are not live are ignored), then ends
  // epochs: a job whose R is empty starts its next epoch, or leaves after the last one.
  const RoundRecord& FinishRound(std::span<const JobId> participants);
  // BeginRound, DrawParticipants, FinishRound.
  const RoundRecord& Step();

  const std::vector<SimJob>& jobs() const { return jobs_; }
  const SamplingTree& tree() const { return tree_; }
  bool live(JobId job) const { return state_[job] == State::kLive; }
  uint64_t epochs_done(JobId job) const { return epochs_done_[job]; }

 private:
  enum class State : uint8_t { kPending, kLive, kLeft };
  Simulation(std::vector<SimJob> jobs, SimOptions options);

  std::vector<SimJob> jobs_;
  SimOptions options_;
  SamplingTree tree_;
  Rng coins_;
  std::vector<State> state_;
  std::vector<uint64_t> epochs_done_;
  size_t live_ = 0, left_ = 0;
  uint64_t round_ = 0;
  RoundRecord record_;
};

// The summary that `carpool sim` prints.
struct SimSummary {
  struct Job {
    std::string name;
    uint64_t assignments = 0;
    uint64_t epochs = 0;
  };
  uint64_t rounds = 0;       // last round with an assignment + 1
  uint64_t assignments = 0;  // (job, sample) deliveries
  uint64_t distinct = 0;     // distinct (round, sample) pairs
  double sharing_ratio = 0;  // assignments / distinct
  std::vector<Job> jobs;
  // The first two jobs, over the rounds in which both took part.
  bool has_pair = false;
  uint64_t pair_rounds = 0;
  uint64_t pair_shared = 0;
  double shared_fraction = 0;  // pair_shared / pair_rounds
  double mean_bound = 0;       // mean of |R1∩R2| / max(|R1|, |R2|) before each such round
  // sqrt(Σ bound_t(1 - bound_t)) / pair_rounds: the standard deviation of shared_fraction around
  // mean_bound when every such round shares with probability bound_t (two jobs: Theorem 1).
  double bound_sd = 0;
};

// Accumulates a SimSummary. |R1∩R2| is kept incrementally and recomputed only after the first two
// jobs join, restart an epoch or leave.
class SimStats {
 public:
  explicit SimStats(const Simulation& sim);
  // Between BeginRound and FinishRound, with the round's participants.
  void BeforeRound(std::span<const JobId> participants);
  void AfterRound(const RoundRecord& record);
  SimSummary Summary() const;
  // The bound of the last round in which both of the first two jobs took part (for tests).
  double last_bound() const { return last_bound_; }

 private:
  const Simulation& sim_;
  SimSummary summary_;
  bool pair_in_round_ = false;
  bool inter_valid_ = false;
  uint64_t inter_ = 0;
  double bound_sum_ = 0;
  double bound_var_sum_ = 0;
  double last_bound_ = 0;
};

// Runs `sim` to the end with the default participation, feeding `stats`; `on_round` (may be
// empty) sees every round after it ran. Returns the summary.
SimSummary RunToEnd(Simulation& sim, SimStats& stats,
                    const std::function<void(const RoundRecord&)>& on_round);

}  // namespace carpool

#endif  // CARPOOL_SIM_SIM_H_
