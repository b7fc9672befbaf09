#include "sim/sim.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

namespace carpool {

namespace {
constexpr uint64_t kCoinSalt = 0x636f696e73ULL;  // "coins": separates the coin stream
}  // namespace

Result<std::unique_ptr<Simulation>> Simulation::Create(std::vector<SimJob> jobs,
                                                       SimOptions options) {
  if (jobs.empty()) {
    return Status::InvalidArgument("no jobs to simulate; give at least one --job NAME=SPEC");
  }
  if (options.epochs == 0) {
    return Status::InvalidArgument("--epochs 0: every job needs at least one epoch");
  }
  std::set<std::string> names;
  for (const SimJob& j : jobs) {
    if (!names.insert(j.name).second) {
      return Status::InvalidArgument(
          fmt::format("job name \"{}\" is given twice; give each --job a distinct name", j.name));
    }
    if (j.dataset.isEmpty()) {
      return Status::InvalidArgument(fmt::format("job \"{}\" has no sample ids", j.name));
    }
    if (!(j.speed > 0 && j.speed <= 1)) {
      return Status::InvalidArgument(
          fmt::format("job \"{}\": speed {} is not in (0, 1]", j.name, j.speed));
    }
  }
  return std::unique_ptr<Simulation>(new Simulation(std::move(jobs), options));
}

Simulation::Simulation(std::vector<SimJob> jobs, SimOptions options)
    : jobs_(std::move(jobs)),
      options_(options),
      tree_(SplitMix64(options.seed)),
      coins_(SplitMix64(options.seed ^ kCoinSalt)),
      state_(jobs_.size(), State::kPending),
      epochs_done_(jobs_.size(), 0) {}

void Simulation::BeginRound() {
  record_ = RoundRecord{};
  if (live_ == 0) {  // nothing can happen before the next start: skip the idle rounds
    uint64_t next = std::numeric_limits<uint64_t>::max();
    for (size_t j = 0; j < jobs_.size(); ++j) {
      if (state_[j] == State::kPending) next = std::min(next, jobs_[j].start);
    }
    if (next != std::numeric_limits<uint64_t>::max()) round_ = std::max(round_, next);
  }
  record_.round = round_;
  for (size_t j = 0; j < jobs_.size(); ++j) {
    if (state_[j] != State::kPending || jobs_[j].start > round_) continue;
    // Names are unique and datasets non-empty (checked in Create), so AddJob cannot fail.
    if (!tree_.AddJob(static_cast<JobId>(j), jobs_[j].dataset).ok()) continue;
    state_[j] = State::kLive;
    ++live_;
    record_.joined.push_back(static_cast<JobId>(j));
  }
}

std::vector<JobId> Simulation::DrawParticipants() {
  constexpr uint64_t kScale = uint64_t{1} << 53;
  std::vector<JobId> out;
  for (size_t j = 0; j < jobs_.size(); ++j) {
    if (state_[j] != State::kLive) continue;
    const auto threshold = static_cast<uint64_t>(jobs_[j].speed * static_cast<double>(kScale));
    if (jobs_[j].speed >= 1.0 || coins_.Uniform(kScale) < threshold) {
      out.push_back(static_cast<JobId>(j));
    }
  }
  return out;
}

const RoundRecord& Simulation::FinishRound(std::span<const JobId> participants) {
  for (JobId j : participants) {
    if (j < jobs_.size() && state_[j] == State::kLive) record_.participants.push_back(j);
  }
  std::sort(record_.participants.begin(), record_.participants.end());
  record_.participants.erase(std::unique(record_.participants.begin(), record_.participants.end()),
                             record_.participants.end());
  record_.epoch = epochs_done_;
  tree_.RunRound(record_.participants, &record_.assignments);
  for (JobId j : record_.participants) {
    if (!tree_.EpochDone(j)) continue;
    record_.epoch_ends.push_back(j);
    const uint64_t epochs = jobs_[j].epochs != 0 ? jobs_[j].epochs : options_.epochs;
    if (++epochs_done_[j] < epochs) {
      if (!tree_.ResetEpoch(j).ok()) continue;  // j is in the tree: cannot fail
    } else {
      if (!tree_.RemoveJob(j).ok()) continue;
      state_[j] = State::kLeft;
      --live_;
      ++left_;
      record_.left.push_back(j);
    }
  }
  ++round_;
  return record_;
}

const RoundRecord& Simulation::Step() {
  BeginRound();
  std::vector<JobId> participants = DrawParticipants();
  return FinishRound(participants);
}

SimStats::SimStats(const Simulation& sim) : sim_(sim) {
  for (const SimJob& j : sim.jobs()) summary_.jobs.push_back({j.name, 0, 0});
  summary_.has_pair = sim.jobs().size() >= 2;
}

void SimStats::BeforeRound(std::span<const JobId> participants) {
  pair_in_round_ = false;
  if (!summary_.has_pair || !sim_.live(0) || !sim_.live(1)) return;
  bool a = false, b = false;
  for (JobId j : participants) {
    a |= j == 0;
    b |= j == 1;
  }
  if (!a || !b) return;
  const Roaring* r0 = sim_.tree().RemainingSet(0);
  const Roaring* r1 = sim_.tree().RemainingSet(1);
  if (!inter_valid_) {
    inter_ = r0->and_cardinality(*r1);
    inter_valid_ = true;
  }
  const uint64_t larger = std::max(sim_.tree().Remaining(0), sim_.tree().Remaining(1));
  last_bound_ = static_cast<double>(inter_) / static_cast<double>(larger);
  bound_sum_ += last_bound_;
  bound_var_sum_ += last_bound_ * (1 - last_bound_);
  pair_in_round_ = true;
}

void SimStats::AfterRound(const RoundRecord& record) {
  bool shared = false;
  for (const Assignment& a : record.assignments) {
    ++summary_.distinct;
    summary_.assignments += a.jobs.size();
    bool in0 = false, in1 = false;
    for (JobId j : a.jobs) {
      ++summary_.jobs[j].assignments;
      in0 |= j == 0;
      in1 |= j == 1;
    }
    if (in0 && in1) shared = true;
    if (!inter_valid_ || !summary_.has_pair || !(in0 || in1)) continue;
    // s left R of the takers only, so the other job's R still shows whether s was in both.
    const Roaring* other = sim_.tree().RemainingSet(in0 ? 1 : 0);
    if ((in0 && in1) || (other != nullptr && other->contains(a.sample))) --inter_;
  }
  if (!record.assignments.empty()) summary_.rounds = record.round + 1;
  if (pair_in_round_) {
    ++summary_.pair_rounds;
    summary_.pair_shared += shared;
  }
  auto touches_pair = [](const std::vector<JobId>& v) {
    return std::find_if(v.begin(), v.end(), [](JobId j) { return j < 2; }) != v.end();
  };
  if (touches_pair(record.joined) || touches_pair(record.epoch_ends)) inter_valid_ = false;
  for (JobId j : record.epoch_ends) ++summary_.jobs[j].epochs;
}

SimSummary SimStats::Summary() const {
  SimSummary s = summary_;
  s.sharing_ratio =
      s.distinct == 0 ? 0 : static_cast<double>(s.assignments) / static_cast<double>(s.distinct);
  if (s.pair_rounds > 0) {
    s.shared_fraction = static_cast<double>(s.pair_shared) / static_cast<double>(s.pair_rounds);
    s.mean_bound = bound_sum_ / static_cast<double>(s.pair_rounds);
    s.bound_sd = std::sqrt(bound_var_sum_) / static_cast<double>(s.pair_rounds);
  }
  return s;
}

SimSummary RunToEnd(Simulation& sim, SimStats& stats,
                    const std::function<void(const RoundRecord&)>& on_round) {
  while (!sim.Done()) {
    sim.BeginRound();
    std::vector<JobId> participants = sim.DrawParticipants();
    stats.BeforeRound(participants);
    const RoundRecord& r = sim.FinishRound(participants);
    stats.AfterRound(r);
    if (on_round) on_round(r);
  }
  return stats.Summary();
}

}  // namespace carpool
