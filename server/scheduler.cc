#include "server/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_set>

namespace carpool {

namespace {
constexpr double kMinRate = 1e-9;  // keeps deadlines finite for a job that stopped consuming
constexpr double kFollowGain = 1.25;  // following must beat DSA's same-round sharing by this
}  // namespace

struct Scheduler::Job {
  JobId id = 0;
  uint32_t epochs = 0;
  uint32_t epoch = 0;  // the epoch whose R is in the tree
  uint64_t prefetch = 0;
  uint64_t batch = 0;  // SetBatch; 0: decide the whole prefetch depth eagerly
  Roaring dataset;  // D: the next epoch's R, for the next use of samples it has consumed
  uint64_t dataset_size = 0;
  std::deque<Decision> queue;
  uint64_t head_seq = 0;  // absolute sequence number of queue.front()
  uint64_t delivered = 0;
  // Rate measure: deliveries and elapsed time, both decayed by exp(-age / time constant). The
  // first delivery only starts the clock.
  bool started = false;
  double last_delivery = 0;
  double weighted_samples = 0;
  double weighted_time = 0;
  double rate = 0;  // at the scheduler's clock, refreshed by RefreshRates
  // Leading queue entries found ready by NextToPrepare (with ready_persists): later walks start
  // after them. Shrinks as Consume pops the front.
  mutable size_t ready_prefix = 0;
  // Pacing: queue entries whose sample another job already took (how far behind it is).
  uint64_t behind = 0;
  // Pacing: time held back (closed spells, and the one open since held_since when holding).
  bool holding = false;
  double held_since = 0;
  double held = 0;
  // Client-bound fraction: decayed time with every batch slot full over decayed time.
  ClientState client = ClientState::kWaitingOnServer;
  double bound_since = 0;  // the clock of the last NoteClient
  double bound_time = 0, observed_time = 0;
  // Pace: decayed deliveries over decayed time not starved, both decayed to pace_since.
  double pace_samples = 0, fed_time = 0, pace_since = 0;
  double pace() const { return fed_time > 0 ? pace_samples / fed_time : 0.0; }
  bool measured() const { return weighted_time > 0 && weighted_samples > 0; }
  // Following (docs/scheduler.md "Following a running job"), in the job's first epoch only. Its
  // permutation interleaves two parts: its own samples (outside the leader's dataset), each step
  // with probability |own left| / |R|, uniformly; and the common samples in the leader's order,
  // those the leader had not drawn at the start first, then the rest in the leader's next epoch.
  // kClosing: it stopped while its coin had chosen the leader's order, so its next step is
  // still a common sample (uniform over those left); re-tossing the coin would favour its own.
  enum class Follow : uint8_t { kUndecided, kOn, kClosing, kOff };
  Follow follow = Follow::kOff;
  JobId leader = 0;
  uint32_t leader_epoch = 0;  // the leader's epoch whose order it copies now
  bool second_phase = false;  // copying the leader's next epoch (the common samples it had drawn)
  Roaring unseen;             // common samples the leader has yet to draw in that epoch
  Roaring own;                // samples of R outside the leader's dataset
  Roaring common;             // its dataset within the leader's
  std::deque<SampleId> pending;  // the leader's draws of common samples, not yet taken
  bool awaits_leader = false;    // the next step's coin chose the leader's order
  bool leader_drew = false;      // the leader took part in this round's draws
  uint64_t followed = 0;         // decisions copied from the leader
  bool followed_epoch = false;   // it followed in its current epoch (its first)
};

Scheduler::Scheduler(const SchedulerOptions& options, RefCountSink* sink)
    : options_(options),
      sink_(sink),
      tree_(options.seed),
      follow_rng_(SplitMix64(options.seed ^ 0x666f6c6c6f77ull)) {
  if (!(options_.rate_time_constant > 0)) options_.rate_time_constant = 10.0;
  if (!(options_.prior_rate > 0)) options_.prior_rate = 1.0;
  if (!(options_.bound_time_constant > 0)) options_.bound_time_constant = 2.0;
  if (!(options_.lift_fraction >= 0 && options_.lift_fraction <= 1)) options_.lift_fraction = 0.5;
  if (!(options_.faster_margin >= 0)) options_.faster_margin = 0.2;
  if (!(options_.pace_time_constant > 0)) options_.pace_time_constant = 5.0;
  if (!(options_.lift_spare_cpu >= 0 && options_.lift_spare_cpu <= 1)) {
    options_.lift_spare_cpu = 0.1;
  }
}

void Scheduler::DecayPace(Job& job, double now) const {
  const double dt = std::max(0.0, now - job.pace_since);
  const double decay = std::exp(-dt / options_.pace_time_constant);
  job.pace_samples *= decay;
  job.fed_time *= decay;
  job.pace_since = std::max(job.pace_since, now);
}

Scheduler::~Scheduler() = default;

Scheduler::Job* Scheduler::Find(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void Scheduler::Report(SampleId sample, int64_t delta) const {
  if (sink_ != nullptr) sink_->AddRef(sample, delta);
}

void Scheduler::ReportDecided(SampleId sample, int64_t delta) const {
  if (sink_ != nullptr) sink_->AddDecided(sample, delta);
}

void Scheduler::ReportAll(const Roaring& set, int64_t delta) const {
  if (sink_ != nullptr) sink_->AddRefAll(set, delta);
}

Status Scheduler::SetRefCountSink(RefCountSink* sink) {
  if (!jobs_.empty()) {
    return Status::FailedPrecondition(
        fmt::format("cannot change the reference-count sink with {} job(s) scheduled; set it "
                    "before the first AddJob",
                    jobs_.size()));
  }
  sink_ = sink;
  return Status::OK();
}

Status Scheduler::AddJob(JobId job, const Roaring& dataset, uint32_t epochs,
                         uint64_t prefetch_samples, double now) {
  return AddJob(job, dataset, epochs, prefetch_samples, now, Start{});
}

Status Scheduler::AddJob(JobId job, const Roaring& dataset, uint32_t epochs,
                         uint64_t prefetch_samples, double now, const Start& start) {
  if (Contains(job)) return Status::AlreadyExists(fmt::format("job {} is already scheduled", job));
  if (epochs == 0 || prefetch_samples == 0 || start.epoch >= epochs) {
    return Status::InvalidArgument(
        fmt::format("job {}: epochs ({}) and prefetch ({} samples) must be at least 1, and the "
                    "epoch it starts in ({}) below epochs",
                    job, epochs, prefetch_samples, start.epoch));
  }
  Status s = start.remaining != nullptr ? tree_.AddJob(job, dataset, *start.remaining)
                                        : tree_.AddJob(job, dataset);
  if (!s.ok()) return s;
  auto state = std::make_unique<Job>();
  state->id = job;
  state->epochs = epochs;
  state->epoch = start.epoch;
  const uint64_t fixed_lookahead =
      options_.lookahead > 0 ? options_.lookahead : (options_.pacing ? 0 : kLookaheadWithoutPacing);
  state->prefetch =
      fixed_lookahead > 0 ? std::min(prefetch_samples, fixed_lookahead) : prefetch_samples;
  state->bound_since = now;
  state->dataset = dataset;
  state->dataset_size = dataset.cardinality();
  // Only a fresh first epoch may follow: later epochs must be independent of earlier ones.
  if (options_.follow && start.epoch == 0 && start.remaining == nullptr) {
    state->follow = Job::Follow::kUndecided;
  }
  jobs_.emplace(job, std::move(state));
  ReportAll(*tree_.RemainingSet(job), +1);
  now_ = std::max(now_, now);
  RefreshRates();
  return Status::OK();
}

Status Scheduler::RemoveJob(JobId id) {
  Job* job = Find(id);
  if (job == nullptr) return Status::NotFound(fmt::format("job {} is not scheduled", id));
  ReportAll(*tree_.RemainingSet(id), -1);
  uint64_t seq = job->head_seq;
  for (const Decision& d : job->queue) {
    DropUse(d.sample, job, seq++);
    Report(d.sample, -1);
    ReportDecided(d.sample, -1);
  }
  Status s = tree_.RemoveJob(id);
  for (auto& [other, follower] : jobs_) {
    if (follower->follow == Job::Follow::kOn && follower->leader == id) StopFollowing(*follower);
  }
  jobs_.erase(id);
  RefreshRates();
  return s;
}

uint64_t Scheduler::UndecideTails(JobId joined, const std::function<uint64_t(JobId)>& keep) {
  const Job* newcomer = Find(joined);
  if (newcomer == nullptr || !options_.pacing) return 0;
  uint64_t returned = 0;
  for (auto& [id, job] : jobs_) {
    if (id == joined || !job->dataset.intersect(newcomer->dataset)) continue;
    const uint64_t kept = keep(id);
    // Only the epoch whose R is in the tree can take its samples back.
    size_t cut = job->queue.size();
    while (cut > kept && job->queue[cut - 1].epoch == job->epoch) --cut;
    // The steps from the cut on are taken again, including a follower's step still waiting on
    // its coin's choice even when nothing is cut: whether a step was waiting depends on which
    // way its coin fell (only "common" waits), so keeping those coins would favour common.
    job->awaits_leader = false;
    // A closing follower's owed common step goes with the steps taken again, plain.
    if (job->follow == Job::Follow::kClosing) StopFollowing(*job);
    if (cut == job->queue.size()) continue;
    Roaring back;
    for (size_t i = cut; i < job->queue.size(); ++i) back.add(job->queue[i].sample);
    // Refused only for a sample outside this epoch's draws, which the queue cannot hold.
    if (!tree_.Return(id, back).ok()) continue;
    if (job->follow == Job::Follow::kOn) {
      // A follower rewinds: its common samples go back to the front of what it copies, in order,
      // its own ones to its own pool, and the steps are taken again with fresh coins.
      for (size_t i = job->queue.size(); i-- > cut;) {
        const SampleId sample = job->queue[i].sample;
        if (job->common.contains(sample)) {
          job->pending.push_front(sample);
          --job->followed;
          --followed_;
        } else {
          job->own.add(sample);
        }
      }
    }
    while (job->queue.size() > cut) {
      const SampleId sample = job->queue.back().sample;
      job->queue.pop_back();
      DropUse(sample, job.get(), job->head_seq + job->queue.size());
      ReportDecided(sample, -1);  // R -> queue counted 0 references, so queue -> R does too
    }
    job->ready_prefix = std::min<size_t>(job->ready_prefix, job->queue.size());
    returned += back.cardinality();
  }
  return returned;
}

bool Scheduler::HasWork(const Job& job) const {
  return tree_.Remaining(job.id) > 0 || job.epoch + 1 < job.epochs;
}

void Scheduler::MaybeResetEpoch(Job& job) {
  if (tree_.Remaining(job.id) > 0 || job.epoch + 1 >= job.epochs) return;
  Status s = tree_.ResetEpoch(job.id);
  if (!s.ok()) return;  // cannot happen: the job is in the tree
  ++job.epoch;
  job.followed_epoch = false;
  ReportAll(*tree_.RemainingSet(job.id), +1);
}

uint64_t Scheduler::Tick(double now, std::vector<Assignment>* decided,
                         std::optional<std::chrono::steady_clock::time_point> deadline) {
  now_ = std::max(now_, now);
  RefreshRates();
  uint64_t rounds = 0;
  cut_short_ = false;
  for (;;) {
    bool triggered = false;
    for (const auto& [id, job] : jobs_) {
      if (job->queue.size() < Trigger(*job) && HasWork(*job)) triggered = true;
    }
    if (!triggered) break;
    if (deadline && rounds > 0 && std::chrono::steady_clock::now() >= *deadline) {
      cut_short_ = true;
      break;
    }
    participants_.clear();
    followers_.clear();
    const uint64_t lookahead = EffectiveLookahead();
    for (auto& [id, job] : jobs_) {
      if (job->follow == Job::Follow::kUndecided) StartFollowing(*job);  // its first round
    }
    for (auto& [id, job] : jobs_) {
      // Masked at L, and at an epoch of its own dataset ahead: deciding further shares nothing
      // more and only grows the queue (an idle job's reached 200,000 decisions, 0.25 s to drop
      // when it left, with 1x1 samples in a 512 MiB cache).
      if (job->queue.size() >= std::min(lookahead, job->dataset_size + 2 * job->prefetch)) continue;
      if (job->follow == Job::Follow::kOn && tree_.Remaining(id) == 0) StopFollowing(*job);
      MaybeResetEpoch(*job);
      if (tree_.Remaining(id) > 0) participants_.push_back(id);
    }
    // After every epoch reset of this round, so that a leader's next epoch is seen as such.
    for (auto& [id, job] : jobs_) {
      if (job->follow == Job::Follow::kOn) UpdateFollowing(*job);
    }
    std::erase_if(participants_, [this](JobId id) {
      Job* job = Find(id);
      if (job->follow != Job::Follow::kOn && job->follow != Job::Follow::kClosing) return false;
      followers_.push_back(job);
      return true;
    });
    round_.clear();
    tree_.RunRound(participants_, &round_);
    for (const Assignment& a : round_) {
      for (JobId id : a.jobs) Decide(*Find(id), a.sample);
    }
    FollowersTakeSteps(lookahead);
    if (decided != nullptr) decided->insert(decided->end(), round_.begin(), round_.end());
    ++rounds;
  }
  rounds_ += rounds;
  return rounds;
}

void Scheduler::Decide(Job& job, SampleId sample) {
  AddUse(sample, &job, job.head_seq + job.queue.size());
  job.queue.push_back(Decision{sample, job.epoch});
  ReportDecided(sample, +1);
}

void Scheduler::DecideStep(Job& job, SampleId sample, bool followed) {
  Decide(job, sample);
  if (followed) {
    ++job.followed;
    ++followed_;
    // For the caller: with the leader's assignment when it drew the sample in this very round
    // (among the tree's assignments only: a rewound follower may take many steps in a round).
    for (size_t i = 0; i < tree_drawn_; ++i) {
      if (round_[i].sample == sample) {
        round_[i].jobs.push_back(job.id);
        return;
      }
    }
  }
  round_.push_back(Assignment{sample, {job.id}, followed});
}

void Scheduler::StartFollowing(Job& job) {
  job.follow = Job::Follow::kOff;
  const Roaring& r = *tree_.RemainingSet(job.id);
  Job* best = nullptr;
  uint64_t best_common = 0;
  const double size = static_cast<double>(r.cardinality());
  for (auto& [id, other] : jobs_) {
    // A leader draws by DSA: uniformly from its R given everything so far, which is what makes
    // its order, restricted to the common samples, a uniform one for the follower.
    // Nor a job that followed in this epoch: where it stands depends on which way its coins
    // fell (it waits only on "common"), so what it has left is not a uniform subset.
    if (other.get() == &job || other->follow != Job::Follow::kOff || other->followed_epoch) {
      continue;
    }
    // The common samples it would hand over: those left in its epoch, and with a next epoch
    // the rest too.
    const uint64_t common = other->epoch + 1 < other->epochs
                                ? other->dataset.and_cardinality(r)
                                : tree_.RemainingSet(id)->and_cardinality(r);
    // Worth it only against a job out of step: for one in step, DSA already takes the common
    // sample in the same round as often as following would (|common| / |D| of the steps), and
    // following adds drift where the datasets differ in size. Follow where the copies beat
    // DSA's first rounds, P(same sample) = |R_other ∩ D| / max(|R_other|, |D|), by a quarter.
    const Roaring& other_r = *tree_.RemainingSet(id);
    const double dsa = static_cast<double>(other_r.and_cardinality(r)) /
                       std::max<double>(static_cast<double>(other_r.cardinality()), size);
    // The copies: every common sample if the leader has a next epoch, else what it has left.
    const double copies = static_cast<double>(common) / size;
    if (copies < kFollowGain * dsa) continue;
    if (common > best_common) {
      best = other.get();
      best_common = common;
    }
  }
  if (best == nullptr) return;
  job.follow = Job::Follow::kOn;
  job.followed_epoch = true;
  job.leader = best->id;
  job.leader_epoch = best->epoch;
  job.second_phase = false;
  job.unseen = *tree_.RemainingSet(best->id) & r;
  job.own = r - best->dataset;
  job.common = r & best->dataset;
  job.pending.clear();
  job.awaits_leader = false;
}

void Scheduler::StopFollowing(Job& job) {
  // What it had not taken stays in its R, drawn uniformly from here on (plain DSA), after the
  // common step its coin may owe.
  job.follow =
      job.awaits_leader && tree_.Remaining(job.id) > 0 ? Job::Follow::kClosing : Job::Follow::kOff;
  job.unseen = Roaring();
  job.own = Roaring();
  job.pending.clear();
  job.awaits_leader = false;
  if (job.follow == Job::Follow::kOff) job.common = Roaring();
}

void Scheduler::UpdateFollowing(Job& job) {
  const Job* leader = Find(job.leader);
  if (leader == nullptr || tree_.Remaining(job.id) == 0) {
    StopFollowing(job);
  } else if (leader->epoch == job.leader_epoch + 1 && !job.second_phase) {
    // The leader drew its whole epoch, so every common sample it had left is handed over; the
    // rest (those it drew before the job came) follow its new epoch's order, which DSA makes
    // independent of the old one.
    job.second_phase = true;
    job.leader_epoch = leader->epoch;
    Roaring handed;
    for (SampleId sample : job.pending) handed.add(sample);
    job.unseen = (*tree_.RemainingSet(job.id) & leader->dataset) - handed;
  } else if (leader->epoch != job.leader_epoch) {
    StopFollowing(job);
  }
}

void Scheduler::FollowersTakeSteps(uint64_t lookahead) {
  const size_t drawn = round_.size();  // the tree's assignments; followers' come after
  tree_drawn_ = drawn;
  for (auto& [id, job] : jobs_) {
    if (job->follow != Job::Follow::kOn) continue;
    job->leader_drew = false;
    for (size_t i = 0; i < drawn; ++i) {
      const Assignment& a = round_[i];
      if (std::find(a.jobs.begin(), a.jobs.end(), job->leader) == a.jobs.end()) continue;
      job->leader_drew = true;
      if (job->unseen.contains(a.sample)) {
        job->unseen.remove(a.sample);
        job->pending.push_back(a.sample);
      }
    }
  }
  Roaring took;
  for (Job* job : followers_) {
    took = Roaring();
    TakeClosingStep(*job, took);
    if (job->follow != Job::Follow::kOn) {
      if (!took.isEmpty()) (void)tree_.Take(job->id, took);
      continue;
    }
    const size_t limit = std::min(lookahead, job->dataset_size + 2 * job->prefetch);
    uint64_t left = tree_.Remaining(job->id);
    while (job->queue.size() < limit && left > 0) {
      if (!job->awaits_leader) {
        // One uniform pick decides both the coin (own with probability |own| / |R|) and, when
        // own, which one.
        const uint64_t pick = follow_rng_.Uniform(left);
        uint32_t sample = 0;
        if (pick < job->own.cardinality() &&
            job->own.select(static_cast<uint32_t>(pick), &sample)) {
          job->own.remove(sample);
          took.add(sample);
          --left;
          DecideStep(*job, sample, false);
          continue;
        }
        job->awaits_leader = true;
      }
      if (job->pending.empty()) {
        // Wait for the leader's next common draw, unless it cannot come: the leader is masked,
        // out of samples, or has handed over every common sample.
        const Job* leader = Find(job->leader);
        const bool more = !job->unseen.isEmpty() || (!job->second_phase && leader != nullptr &&
                                                     leader->epoch + 1 < leader->epochs);
        if (!job->leader_drew || !more) {
          StopFollowing(*job);
          TakeClosingStep(*job, took);
        }
        break;
      }
      const SampleId sample = job->pending.front();
      job->pending.pop_front();
      job->awaits_leader = false;
      took.add(sample);
      --left;
      DecideStep(*job, sample, true);
    }
    // Cannot fail: own, pending and the closing step's samples are all in its R.
    if (!took.isEmpty()) (void)tree_.Take(job->id, took);
  }
}

void Scheduler::TakeClosingStep(Job& job, Roaring& took) {
  if (job.follow != Job::Follow::kClosing) return;
  const Roaring left = (*tree_.RemainingSet(job.id) - took) & job.common;
  uint32_t sample = 0;
  if (!left.isEmpty() &&
      left.select(static_cast<uint32_t>(follow_rng_.Uniform(left.cardinality())), &sample)) {
    took.add(sample);
    DecideStep(job, sample, false);
  }
  job.follow = Job::Follow::kOff;
  job.common = Roaring();
}

bool Scheduler::NextBatch(JobId id, size_t b, std::vector<Decision>* out, size_t skip) const {
  out->clear();
  const Job* job = Find(id);
  if (job == nullptr || job->queue.size() <= skip || b == 0) return false;
  const uint32_t epoch = job->queue[skip].epoch;
  size_t k = 0;
  while (k < b && skip + k < job->queue.size() && job->queue[skip + k].epoch == epoch) ++k;
  const bool epoch_decided = epoch < job->epoch || tree_.Remaining(id) == 0;
  if (k < b && !epoch_decided) return false;
  const auto first = job->queue.begin() + static_cast<ptrdiff_t>(skip);
  out->assign(first, first + static_cast<ptrdiff_t>(k));
  return true;
}

const std::deque<Decision>* Scheduler::Queue(JobId id) const {
  const Job* job = Find(id);
  return job == nullptr ? nullptr : &job->queue;
}

Status Scheduler::Consume(JobId id, size_t n, double now) {
  Job* job = Find(id);
  if (job == nullptr) return Status::NotFound(fmt::format("job {} is not scheduled", id));
  if (n > job->queue.size()) {
    return Status::InvalidArgument(
        fmt::format("job {}: cannot deliver {} samples, only {} are decided; run Tick first", id, n,
                    job->queue.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    SampleId sample = job->queue.front().sample;
    DropUse(sample, job, job->head_seq);
    job->queue.pop_front();
    ++job->head_seq;
    Report(sample, -1);
    ReportDecided(sample, -1);
    // Still queued for someone: it must survive in the cache until then.
    // (Not when only this job's own entry of a later epoch holds it.)
    auto still = uses_.find(sample);
    if (still != uses_.end() && owed_.count(sample) == 0 &&
        std::any_of(still->second.begin(), still->second.end(),
                    [job](const Use& u) { return u.job != job; })) {
      owed_.emplace(sample, 1);
      for (const Use& u : still->second) ++u.job->behind;
    }
  }
  job->delivered += n;
  job->ready_prefix -= std::min(job->ready_prefix, n);
  now_ = std::max(now_, now);
  DecayPace(*job, now_);
  job->pace_samples += static_cast<double>(n);
  if (n > 0) {
    if (!job->started) {
      job->started = true;
    } else {
      const double dt = std::max(0.0, now_ - job->last_delivery);
      const double decay = std::exp(-dt / options_.rate_time_constant);
      job->weighted_samples = job->weighted_samples * decay + static_cast<double>(n);
      job->weighted_time = job->weighted_time * decay + dt;
    }
    job->last_delivery = now_;
  }
  RefreshRates();
  return Status::OK();
}

bool Scheduler::Finished(JobId id) const {
  const Job* job = Find(id);
  return job != nullptr && job->queue.empty() && !HasWork(*job);
}

void Scheduler::RefreshRates() {
  double sum = 0;
  int measured = 0;
  for (auto& [id, job] : jobs_) {
    if (!job->measured()) continue;
    // Time since the last delivery counts as time without deliveries, so a stalled job slows.
    const double idle = std::max(0.0, now_ - job->last_delivery);
    const double decay = std::exp(-idle / options_.rate_time_constant);
    job->rate =
        std::max(kMinRate, job->weighted_samples * decay / (job->weighted_time * decay + idle));
    sum += job->rate;
    ++measured;
  }
  const double prior = measured > 0 ? sum / measured : options_.prior_rate;
  for (auto& [id, job] : jobs_) {
    if (!job->measured()) job->rate = prior;
  }
}

void Scheduler::AddUse(SampleId sample, Job* job, uint64_t seq) {
  const double at =
      now_ + static_cast<double>(seq - job->head_seq + 1) / std::max(job->rate, 1e-9);
  std::vector<Use>& v = uses_[sample];
  v.push_back(Use{job, seq, at});
  if (owed_.count(sample) != 0) ++job->behind;
  if (sink_ != nullptr && sink_->WantsNextUses()) sink_->NextUseChanged(sample, EarliestUse(v));
}

double Scheduler::EarliestUse(const std::vector<Use>& uses) {
  double at = std::numeric_limits<double>::infinity();
  for (const Use& u : uses) at = std::min(at, u.at);
  return at;
}

void Scheduler::DropUse(SampleId sample, const Job* job, uint64_t seq) {
  auto it = uses_.find(sample);
  if (it == uses_.end()) return;
  std::vector<Use>& v = it->second;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].job == job && v[i].seq == seq) {
      if (owed_.count(sample) != 0) --v[i].job->behind;
      v[i] = v.back();
      v.pop_back();
      break;
    }
  }
  const bool report = sink_ != nullptr && sink_->WantsNextUses();
  const double at = report ? EarliestUse(v) : 0;
  if (v.empty()) {
    uses_.erase(it);
    owed_.erase(sample);
  }
  if (report) sink_->NextUseChanged(sample, at);
}

double Scheduler::NextUse(uint32_t sample) const {
  double best = std::numeric_limits<double>::infinity();
  auto it = uses_.find(sample);
  if (it != uses_.end()) {
    for (const Use& u : it->second) {
      best = std::min(best, static_cast<double>(u.seq - u.job->head_seq) / u.job->rate);
    }
  }
  // Not yet decided for a job: drawn at a uniformly random position of the rest of the job's
  // epoch, so expected after its queue and half of R ((|R| + 1) / 2 draws); a sample the job has
  // already drawn this epoch comes back in its next epoch, if it has one.
  for (const auto& [id, job] : jobs_) {
    const double queued = static_cast<double>(job->queue.size());
    const Roaring* r = tree_.RemainingSet(id);
    const double remaining = static_cast<double>(tree_.Remaining(id));
    double position;
    if (r->contains(sample)) {
      position = queued + (remaining + 1) / 2;
    } else if (job->epoch + 1 < job->epochs && job->dataset.contains(sample)) {
      position = queued + remaining + (static_cast<double>(job->dataset_size) + 1) / 2;
    } else {
      continue;
    }
    best = std::min(best, position / job->rate);
  }
  return best;
}

void Scheduler::NextToPrepare(size_t k, const std::function<bool(SampleId)>& ready,
                              std::vector<SampleId>* out, size_t horizon,
                              bool ready_persists) const {
  // A k-way merge of the queues: within one queue deadlines grow with the position. With
  // ready_persists a job's walk starts after its known-ready prefix, so a long queue of samples
  // prepared ahead is not walked again at every call (H100: a job 2,304 samples ahead, a call per
  // preparation).
  using Head = std::tuple<double, JobId, size_t>;  // deadline, job, position
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  size_t looked = 0;
  for (const auto& [id, job] : jobs_) {
    const size_t start = ready_persists ? std::min(job->ready_prefix, job->queue.size()) : 0;
    looked += start;  // the horizon still counts from the front of the queues
    if (start < job->queue.size()) {
      heads.emplace(static_cast<double>(start) / std::max(job->rate, kMinRate), id, start);
    }
  }
  std::unordered_set<SampleId> chosen;
  size_t emitted = 0;
  while (emitted < k && looked < horizon && !heads.empty()) {
    auto [deadline, id, pos] = heads.top();
    heads.pop();
    ++looked;
    const Job& job = *jobs_.at(id);
    const SampleId sample = job.queue[pos].sample;
    const bool is_ready = ready(sample);
    if (ready_persists && is_ready && pos == job.ready_prefix) ++job.ready_prefix;
    if (!chosen.count(sample) && !is_ready) {
      chosen.insert(sample);
      out->push_back(sample);
      ++emitted;
    }
    if (pos + 1 < job.queue.size()) {
      heads.emplace(static_cast<double>(pos + 1) / job.rate, id, pos + 1);
    }
  }
}

std::vector<JobId> Scheduler::Jobs() const {
  std::vector<JobId> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  return ids;
}

Result<Scheduler::JobStats> Scheduler::Stats(JobId id) const {
  const Job* job = Find(id);
  if (job == nullptr) return Status::NotFound(fmt::format("job {} is not scheduled", id));
  JobStats s;
  s.epoch = job->epoch;
  s.epochs = job->epochs;
  s.remaining = tree_.Remaining(id);
  s.queued = job->queue.size();
  s.delivered = job->delivered;
  s.prefetch = job->prefetch;
  s.rate = job->rate;
  s.measured = job->measured();
  s.held = job->held + (job->holding ? std::max(0.0, now_ - job->held_since) : 0.0);
  s.client_bound = job->observed_time > 0 ? job->bound_time / job->observed_time : 0;
  s.pace = job->pace();
  s.behind = job->behind;
  if (job->follow == Job::Follow::kOn) s.leader = job->leader;
  s.followed = job->followed;
  return s;
}

void Scheduler::SetCapacity(uint64_t samples) { capacity_ = samples; }

void Scheduler::SetBatch(JobId id, uint64_t batch) {
  if (Job* job = Find(id)) job->batch = batch;
}

uint64_t Scheduler::Trigger(const Job& job) const {
  if (job.batch == 0 || !options_.pacing) return job.prefetch;
  // Decide when needed, not eagerly: a job that decides its whole prefetch depth alone (the
  // first to connect, or the first into an epoch) takes samples its peers must draw later, on
  // their own. Deep decisions pay only where the cache can hold what is prepared ahead.
  if (capacity_ == 0) return std::min(job.prefetch, job.batch);
  const uint64_t share = capacity_ / (2 * std::max<size_t>(1, jobs_.size()));
  return std::min(job.prefetch, std::max(job.batch, share));
}

uint64_t Scheduler::Window(uint64_t batch, uint64_t pinned) const {
  // Room for the owed samples: what the pins leave, less the room the leader's next batch needs
  // to be prepared ahead; never less than one batch (below that nothing moves).
  const uint64_t free = capacity_ > pinned ? capacity_ - pinned : 0;
  return std::max<uint64_t>(std::max<uint64_t>(batch, 1), free > batch ? free - batch : 0);
}

uint64_t Scheduler::PrepareAheadHorizon(uint64_t occupied) const {
  if (capacity_ == 0) return UINT64_MAX;
  if (occupied < capacity_) return capacity_;
  uint64_t prefetch = 0;
  for (const auto& [id, job] : jobs_) prefetch += job->prefetch;
  return std::min(capacity_, prefetch);
}

uint64_t Scheduler::MaxPrefetch() const {
  uint64_t prefetch = 0;
  for (const auto& [id, job] : jobs_) prefetch = std::max(prefetch, job->prefetch);
  return prefetch;
}

uint64_t Scheduler::EffectiveLookahead() const {
  if (options_.lookahead > 0) return options_.lookahead;
  if (!options_.pacing) return kLookaheadWithoutPacing;  // the server before pacing
  const uint64_t prefetch = MaxPrefetch();
  // Without a known capacity (no preparation measured yet) the window is the largest batch.
  const uint64_t window = capacity_ > 0 ? Window(prefetch, last_pinned_) : prefetch;
  return std::max<uint64_t>(64, window + 2 * prefetch);
}

void Scheduler::NoteClient(JobId id, ClientState state, double now) {
  Job* job = Find(id);
  if (job == nullptr) return;
  const double dt = std::max(0.0, now - job->bound_since);
  const double decay = std::exp(-dt / options_.bound_time_constant);
  // The state since the last call held for dt.
  job->bound_time = job->bound_time * decay + (job->client == ClientState::kBound ? dt : 0.0);
  job->observed_time = job->observed_time * decay + dt;
  DecayPace(*job, now);
  if (job->client != ClientState::kStarved) job->fed_time += dt;
  job->client = state;
  job->bound_since = now;
}

bool Scheduler::MayTake(JobId id, size_t n, uint64_t pinned, double now, size_t skip) {
  Job* job = Find(id);
  if (job == nullptr) return true;
  now_ = std::max(now_, now);
  last_pinned_ = pinned;
  auto grant = [&](bool lifted) {
    if (job->holding) {
      job->held += std::max(0.0, now_ - job->held_since);
      job->holding = false;
    }
    if (lifted) ++lifts_;
    return true;
  };
  if (!options_.pacing || capacity_ == 0) return grant(false);
  skip = std::min(skip, job->queue.size());
  n = std::min(n, job->queue.size() - skip);
  // The samples this batch would make owed: queued for another job, not yet taken by anyone.
  uint64_t fresh = 0;
  laggers_.clear();
  for (size_t i = skip; i < skip + n; ++i) {
    const SampleId sample = job->queue[i].sample;
    if (owed_.count(sample) != 0) continue;
    auto it = uses_.find(sample);
    if (it == uses_.end()) continue;
    bool shared = false;
    for (const Use& u : it->second) {
      if (u.job == job) continue;
      shared = true;
      laggers_.push_back(u.job);
    }
    fresh += shared;
  }
  last_batch_ = n;
  if (fresh == 0 || owed_.size() + fresh <= Window(n, pinned)) return grant(false);
  // The job furthest behind among those it would lead always moves: with queues decided in
  // different rounds each job's batch may mix owed and fresh samples, and holding every one of
  // them would deadlock.
  bool furthest_behind = true;
  for (const Job* lagger : laggers_) {
    if (lagger->behind > job->behind) {
      furthest_behind = false;
      break;
    }
  }
  if (furthest_behind) return grant(false);
  // Lift for a job whose laggers are slower by nature: each waits on its own client, and this
  // job's pace is clearly above each one's (not a lead that timing noise gave it); and only with
  // spare CPU for the re-preparations it causes.
  bool all_bound = !spare_cpu_ || *spare_cpu_ >= options_.lift_spare_cpu;
  const double pace = job->pace();
  for (const Job* lagger : laggers_) {
    // A job level with this one is no lagger: held too, its slots empty, it would never count
    // as client-bound and two fast jobs would keep each other at a slow one's pace.
    if (lagger->behind <= job->behind) continue;
    const double fraction =
        lagger->observed_time > 0 ? lagger->bound_time / lagger->observed_time : 0.0;
    if (fraction < options_.lift_fraction || pace <= 0 ||
        pace < (1 + options_.faster_margin) * lagger->pace()) {
      all_bound = false;
      break;
    }
  }
  if (all_bound) return grant(true);
  if (!job->holding) {
    job->holding = true;
    job->held_since = now_;
    ++holds_;
  }
  return false;
}

PacingStats Scheduler::pacing() const {
  PacingStats p;
  p.enabled = options_.pacing;
  p.capacity = capacity_;
  p.window = capacity_ > 0 ? Window(last_batch_, last_pinned_) : 0;
  p.owed = owed_.size();
  p.lookahead = EffectiveLookahead();
  p.derived_lookahead = options_.lookahead == 0;
  p.holds = holds_;
  p.lifts = lifts_;
  p.spare_cpu = spare_cpu_.value_or(-1.0);
  return p;
}

}  // namespace carpool
