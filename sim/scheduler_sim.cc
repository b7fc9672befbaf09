#include "sim/scheduler_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numbers>
#include <string>

#include "common/splitmix.h"
#include "sampler/rng.h"
#include "sim/belady.h"
#include "server/scheduler.h"

namespace carpool {

namespace {

constexpr uint64_t kJitterStream = 0x6a6974746572ULL;  // "jitter": the speed factors' seed

// A standard normal draw (Box-Muller) from the sim's own generator, so that a seed gives the same
// run with every standard library (std::normal_distribution is implementation-defined).
double StandardNormal(Rng& rng) {
  const double u1 = (static_cast<double>(rng.Next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

SchedulerOptions ToSchedulerOptions(const SchedulerSimOptions& o) {
  SchedulerOptions s;
  s.seed = o.seed;
  s.lookahead = o.lookahead;
  s.rate_time_constant = o.rate_time_constant;
  s.prior_rate = 1.0;
  s.pacing = o.pacing;
  s.follow = o.follow;
  return s;
}

// The simulation's state; one instance per run.
class Sim {
 public:
  Sim(const std::vector<SimJobSpec>& specs, const SchedulerSimOptions& options,
      const SimObserver& observer)
      : specs_(specs),
        options_(options),
        observer_(observer),
        index_(cache::CacheIndex::Options{options.policy, options.cache_samples, 0}, &scheduler_),
        refs_(&index_),
        scheduler_(ToSchedulerOptions(options), &refs_),
        jobs_(specs.size()),
        jitter_(SplitMix64(options.seed + kJitterStream)) {
    result_.jobs.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) result_.jobs[i].name = specs[i].name;
  }

  Result<SchedulerSimResult> Run() {
    // The pacing's window is the cache: without one nothing is shared, so nothing is held.
    if (options_.cache_samples > 0) scheduler_.SetCapacity(options_.cache_samples);
    const size_t n = specs_.size();
    size_t finished = 0;
    uint64_t t = 0;
    for (; finished < n; ++t) {
      Status s = Admit(t);
      if (!s.ok()) return s;
      StartTick(t);
      // With a limited capacity the job served first gets it, so who goes first rotates. With
      // none, the order only decides which of two sharers hits, and stays fixed.
      const size_t first = Limited() ? t % n : 0;
      for (size_t k = 0; k < n; ++k) {
        const size_t i = (first + k) % n;
        if (jobs_[i].state != kRunning) continue;
        s = Turn(i, t);
        if (!s.ok()) return s;
        if (scheduler_.Finished(Id(i))) {
          s = Finish(i, t);
          if (!s.ok()) return s;
          ++finished;
        }
      }
      Decide(t);
      s = PrepareAhead();
      if (!s.ok()) return s;
      Observe(t);
      s = CheckProgress(t);
      if (!s.ok()) return s;
    }
    result_.ticks = t;
    result_.rounds = scheduler_.rounds();
    const PacingStats pacing = scheduler_.pacing();
    result_.holds = pacing.holds;
    result_.followed = scheduler_.followed();
    result_.lifts = pacing.lifts;
    result_.evictions = index_.stats().evictions;
    result_.belady_preparations = BeladyMin(requests_, options_.cache_samples).misses;
    if (options_.keep_requests) result_.requests = std::move(requests_);
    return std::move(result_);
  }

 private:
  enum State { kWaiting, kRunning, kDone };
  struct JobState {
    State state = kWaiting;
    double credit = 0;             // deliveries owed
    double factor = 1;             // this tick's speed factor (jitter)
    uint64_t jitter_age = 0;       // ticks run, for jitter_period
    size_t open = 0;               // deliveries left in the open batch (0: none open)
    std::vector<SampleId> pinned;  // the open batch's delivered samples
    std::deque<bool> shared;       // parallel to the job's decided queue: drawn in a shared round
    // This tick: deliveries, and whether the server held it back (pacing, capacity).
    uint64_t delivered = 0;
    bool held = false;
    bool starved = false;
  };

  static JobId Id(size_t i) { return static_cast<JobId>(i + 1); }
  bool Limited() const { return options_.prep_capacity > 0; }
  uint64_t Pinned() const { return index_.stats().bytes_pinned; }  // 1 byte per sample

  Status Admit(uint64_t t) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      JobState& job = jobs_[i];
      if (job.state != kWaiting || specs_[i].start > static_cast<double>(t)) continue;
      // The trigger depth is at least a batch, or NextBatch would wait for rounds never run.
      Status s =
          scheduler_.AddJob(Id(i), specs_[i].dataset, specs_[i].epochs,
                            std::max(options_.prefetch, options_.batch), static_cast<double>(t));
      if (!s.ok()) return s;
      // As the engine does: with pacing, decide when needed (the lazy trigger).
      if (options_.batch > 0) scheduler_.SetBatch(Id(i), options_.batch);
      job.state = kRunning;
    }
    return Status::OK();
  }

  // The client-bound notes of the previous tick, this tick's speed factors and capacity.
  void StartTick(uint64_t t) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      JobState& job = jobs_[i];
      if (job.state != kRunning) continue;
      // Bound: the server gave the job everything its speed asked for; it waits on itself. A
      // held job got nothing (starved); one that waited on a preparation was partly fed.
      scheduler_.NoteClient(Id(i),
                            job.held      ? ClientState::kStarved
                            : job.starved ? ClientState::kWaitingOnServer
                                          : ClientState::kBound,
                            static_cast<double>(t));
      job.delivered = 0;
      job.held = job.starved = false;
      // A factor lasts jitter_period ticks from the job's first: a job slowed for a while.
      if (options_.jitter > 0 && job.jitter_age++ % options_.jitter_period == 0) {
        job.factor = std::max(0.0, 1.0 + options_.jitter * StandardNormal(jitter_));
      }
    }
    if (Limited()) {
      prep_credit_ += options_.prep_capacity;
      budget_ = static_cast<uint64_t>(prep_credit_);
      prep_credit_ -= static_cast<double>(budget_);  // the fraction carries; unused whole ones not
    }
  }

  // One preparation of the tick's capacity; false when it is spent.
  bool TakeCapacity() {
    if (!Limited()) return true;
    if (budget_ == 0) return false;
    --budget_;
    return true;
  }

  void Decide(uint64_t t) {
    decided_.clear();
    scheduler_.Tick(static_cast<double>(t), &decided_);
    for (const Assignment& a : decided_) {
      for (JobId id : a.jobs) jobs_[id - 1].shared.push_back(a.jobs.size() > 1 || a.followed);
    }
  }

  // The job's deliveries of this tick: whole batches while it has the credit, the pacing lets it
  // and (with a limited capacity) its misses can be prepared. A starved job keeps its credit, up
  // to two batches, so that it does not burst afterwards.
  Status Turn(size_t i, uint64_t t) {
    JobState& job = jobs_[i];
    const double batch = static_cast<double>(std::max<uint64_t>(options_.batch, 1));
    job.credit =
        std::min(job.credit + specs_[i].speed * job.factor, 2 * std::max(batch, specs_[i].speed));
    for (;;) {
      if (job.open == 0) {
        Status s = StartBatch(i, t);
        if (!s.ok()) return s;
        if (job.open == 0) break;
      }
      bool delivered = false;
      Status s = DeliverOne(i, t, &delivered);
      if (!s.ok()) return s;
      if (!delivered) break;
      if (job.open == 0) {
        s = Unpin(job);
        if (!s.ok()) return s;
      }
    }
    if (options_.batch > 0) return Status::OK();
    job.open = 0;  // batch 0: the tick's deliveries were the batch
    return Unpin(job);
  }

  // Opens the job's next batch (job.open > 0) if it is owed one and the pacing lets it take it.
  Status StartBatch(size_t i, uint64_t t) {
    JobState& job = jobs_[i];
    const std::deque<Decision>* queue = scheduler_.Queue(Id(i));
    size_t n = 0;
    if (options_.batch == 0) {
      n = static_cast<size_t>(job.credit);
      if (n == 0) return Status::OK();
      if (queue->empty()) Decide(t);
    } else {
      if (queue->size() < options_.batch) Decide(t);
      if (scheduler_.NextBatch(Id(i), options_.batch, &batch_)) {
        n = batch_.size();
      } else if (!queue->empty()) {
        return Status::Internal(fmt::format(
            "job {}: no batch of {} with {} decided after the rounds; the look-ahead is too short",
            specs_[i].name, options_.batch, queue->size()));
      }
      if (static_cast<double>(n) > job.credit) return Status::OK();  // waits on its client
    }
    if (queue->empty()) {  // every epoch delivered
      job.credit = 0;
      return Status::OK();
    }
    if (!scheduler_.MayTake(Id(i), n, Pinned(), static_cast<double>(t))) {
      if (!job.held) ++result_.jobs[i].held_ticks;
      job.held = true;
      return Status::OK();
    }
    job.open = n;
    return Status::OK();
  }

  // Delivers the front of the job's queue, in its open batch. `delivered` false: not now (out of
  // credit, done, or a miss with the tick's capacity spent).
  Status DeliverOne(size_t i, uint64_t t, bool* delivered) {
    *delivered = false;
    JobState& job = jobs_[i];
    SchedulerSimResult::Job& out = result_.jobs[i];
    if (job.credit < 1.0) return Status::OK();
    const std::deque<Decision>* queue = scheduler_.Queue(Id(i));
    if (queue->empty()) Decide(t);
    if (queue->empty()) {  // every epoch delivered
      job.credit = 0;
      job.open = 0;
      return Status::OK();
    }
    const Decision d = queue->front();
    if (index_.Find(d.sample) == nullptr && !TakeCapacity()) {
      if (!job.starved) ++out.starved_ticks;
      job.starved = true;
      return Status::OK();
    }
    const bool hit = index_.Lookup(d.sample).has_value();
    bool cached = hit;
    if (!hit) {
      ++result_.preparations;
      ++out.preparations;
      evicted_.clear();
      // A full cache of pinned samples: prepared into a transient buffer, not cached.
      cached = index_.MakeRoom(1, &evicted_).ok() && index_.Insert(d.sample, 0, 1).ok();
    }
    if (cached) {
      Status s = index_.Pin(d.sample);
      if (!s.ok()) return s;
      job.pinned.push_back(d.sample);
    }
    result_.hits += hit;
    ++result_.deliveries;
    ++out.deliveries;
    result_.shared_deliveries += job.shared.front();
    job.shared.pop_front();
    out.epochs = std::max(out.epochs, d.epoch);  // every earlier epoch is complete
    requests_.push_back(d.sample);
    if (observer_.on_delivery) observer_.on_delivery(SimDelivery{t, i, d.epoch, d.sample, hit});
    Status s = scheduler_.Consume(Id(i), 1, static_cast<double>(t));
    if (!s.ok()) return s;
    job.credit -= 1.0;
    --job.open;
    ++job.delivered;
    *delivered = true;
    return Status::OK();
  }

  Status Unpin(JobState& job) {
    for (SampleId s : job.pinned) {
      Status st = index_.Unpin(s);
      if (!st.ok()) return st;
    }
    job.pinned.clear();
    return Status::OK();
  }

  Status Finish(size_t i, uint64_t t) {
    JobState& job = jobs_[i];
    Status s = Unpin(job);
    if (s.ok()) s = scheduler_.RemoveJob(Id(i));
    if (!s.ok()) return s;
    job.state = kDone;
    result_.jobs[i].epochs = specs_[i].epochs;
    result_.jobs[i].finish_tick = t;
    return Status::OK();
  }

  // The tick's leftover capacity prepares queued samples ahead, earliest deadline first, as the
  // engine's idle workers do, and like them only into room that holds no decided sample (past
  // that, preparing ahead would evict samples that jobs have decided, the laggers' owed ones
  // first, to hold samples needed later), and once the cache is full only as far as the jobs'
  // prefetch depths (further, each would evict a sample a job may still draw).
  Status PrepareAhead() {
    if (!Limited() || budget_ == 0 || options_.cache_samples == 0) return Status::OK();
    const cache::IndexStats held = index_.stats();
    const uint64_t capacity = options_.cache_samples;
    const uint64_t room = capacity > held.decided_entries ? capacity - held.decided_entries : 0;
    const size_t want = static_cast<size_t>(std::min(budget_, room));
    if (want == 0) return Status::OK();
    const uint64_t horizon = scheduler_.PrepareAheadHorizon(held.entries);
    ahead_.clear();
    scheduler_.NextToPrepare(
        want, [this](SampleId s) { return index_.Find(s) != nullptr; }, &ahead_, horizon);
    for (SampleId s : ahead_) {
      evicted_.clear();
      if (!index_.MakeRoom(1, &evicted_).ok()) break;  // every entry is pinned
      Status st = index_.Insert(s, 0, 1);
      if (!st.ok()) return st;
      ++result_.preparations;
      ++result_.prepared_ahead;
      --budget_;
    }
    return Status::OK();
  }

  // Fails when the pacing holds jobs and nothing has been delivered for longer than any job
  // takes to be owed a batch: MayTake's answers cannot change without deliveries (the owed set
  // only shrinks by them, and a held job is not client-bound, so no lift comes), so the run would
  // never end.
  Status CheckProgress(uint64_t t) {
    bool held = false;
    uint64_t delivered = 0;
    for (const JobState& job : jobs_) {
      if (job.state != kRunning) continue;
      held |= job.held;
      delivered += job.delivered;
    }
    stalled_ticks_ = held && delivered == 0 ? stalled_ticks_ + 1 : 0;
    if (stalled_ticks_ <= StallLimit()) return Status::OK();
    std::string names;
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (jobs_[i].state == kRunning && jobs_[i].held) {
        names += (names.empty() ? "" : ", ") + specs_[i].name;
      }
    }
    const PacingStats p = scheduler_.pacing();
    return Status::Internal(fmt::format(
        "pacing deadlock: no delivery in ticks {}-{} while the pacing holds job(s) {} ({} owed "
        "samples, window {}); each waits for a job that is held too. This is a scheduler bug: "
        "report it with this command line, and rerun with --pacing off to compare",
        t + 1 - stalled_ticks_, t, names, p.owed, p.window));
  }

  // Ticks without a delivery after which a run whose jobs are held is stuck: a few times the
  // longest a job takes to be owed a whole batch, or a jitter factor of 0 lasts.
  uint64_t StallLimit() const {
    double longest = 0;
    const double batch = static_cast<double>(std::max<uint64_t>(options_.batch, 1));
    for (const SimJobSpec& j : specs_) longest = std::max(longest, batch / j.speed);
    const uint64_t period = options_.jitter > 0 ? options_.jitter_period : 0;
    return 100 + 4 * (static_cast<uint64_t>(std::ceil(longest)) + period);
  }

  void Observe(uint64_t t) {
    bool running = false;
    for (const JobState& job : jobs_) running |= job.state == kRunning;
    if (!running) return;
    const PacingStats p = scheduler_.pacing();
    result_.lookahead = std::max(result_.lookahead, p.lookahead);
    result_.window = std::max(result_.window, p.window);
    result_.max_owed = std::max(result_.max_owed, p.owed);
    if (!observer_.on_job_tick) return;
    for (size_t i = 0; i < specs_.size(); ++i) {
      const JobState& job = jobs_[i];
      if (job.state != kRunning) continue;
      observer_.on_job_tick(SimJobTick{t, i, job.delivered, job.held, job.starved,
                                       scheduler_.Queue(Id(i))->size(), p.owed, job.credit});
    }
  }

  const std::vector<SimJobSpec>& specs_;
  const SchedulerSimOptions& options_;
  const SimObserver& observer_;
  // Construction order matters: the index asks the scheduler for next uses, the scheduler sends
  // reference counts to the index. Neither calls the other while being constructed.
  cache::CacheIndex index_;
  RefCountForwarder<cache::CacheIndex> refs_;
  Scheduler scheduler_;
  std::vector<JobState> jobs_;
  Rng jitter_;
  double prep_credit_ = 0;      // fraction of a preparation carried to the next tick
  uint64_t budget_ = 0;         // preparations left in this tick
  uint64_t stalled_ticks_ = 0;  // consecutive ticks with jobs held and no delivery
  SchedulerSimResult result_;
  std::vector<SampleId> requests_;
  std::vector<Assignment> decided_;
  std::vector<Decision> batch_;
  std::vector<SampleId> ahead_;
  std::vector<cache::CacheIndex::Evicted> evicted_;
};

}  // namespace

Status ValidateSchedulerSim(const std::vector<SimJobSpec>& jobs,
                            const SchedulerSimOptions& options) {
  if (jobs.empty()) return Status::InvalidArgument("no job to simulate; give at least one --job");
  if (options.prefetch == 0) {
    return Status::InvalidArgument("--prefetch 0: the prefetch depth must be at least 1 sample");
  }
  if (!std::isfinite(options.jitter) || options.jitter < 0) {
    return Status::InvalidArgument(
        fmt::format("--jitter {}: expected a finite number >= 0, the standard deviation of a job's "
                    "speed factor (e.g. 0.3); use 0 for exact speeds",
                    options.jitter));
  }
  if (options.jitter_period == 0) {
    return Status::InvalidArgument(
        "--jitter-period 0: a speed factor lasts at least 1 tick; use 1 for a new one every tick");
  }
  if (!std::isfinite(options.prep_capacity) || options.prep_capacity < 0) {
    return Status::InvalidArgument(fmt::format(
        "--prep-capacity {}: expected a finite number >= 0 of preparations per tick (e.g. 2); "
        "use 0 for unlimited",
        options.prep_capacity));
  }
  if (options.lookahead > 0 && options.batch > options.lookahead) {
    return Status::InvalidArgument(fmt::format(
        "--batch {} exceeds --lookahead {}: no job could have a whole batch decided; use a smaller "
        "batch, a look-ahead of at least the batch, or --lookahead 0 (derived)",
        options.batch, options.lookahead));
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const SimJobSpec& j = jobs[i];
    for (size_t k = 0; k < i; ++k) {
      if (jobs[k].name == j.name) {
        return Status::InvalidArgument(
            fmt::format("two jobs are named \"{}\"; give each job its own name", j.name));
      }
    }
    if (j.dataset.isEmpty()) {
      return Status::InvalidArgument(fmt::format("job {}: its dataset is empty", j.name));
    }
    if (!std::isfinite(j.speed) || j.speed <= 0) {
      return Status::InvalidArgument(fmt::format(
          "job {}: speed {} must be a positive number of samples per tick", j.name, j.speed));
    }
    if (!std::isfinite(j.start) || j.start < 0) {
      return Status::InvalidArgument(
          fmt::format("job {}: start {} must be a tick >= 0", j.name, j.start));
    }
    if (j.epochs == 0) return Status::InvalidArgument(fmt::format("job {}: 0 epochs", j.name));
  }
  return Status::OK();
}

Result<SchedulerSimResult> RunSchedulerSim(const std::vector<SimJobSpec>& jobs,
                                           const SchedulerSimOptions& options,
                                           const SimObserver& observer) {
  Status s = ValidateSchedulerSim(jobs, options);
  if (!s.ok()) return s;
  Sim sim(jobs, options, observer);
  return sim.Run();
}

Result<SchedulerSimResult> RunSchedulerSim(
    const std::vector<SimJobSpec>& jobs, const SchedulerSimOptions& options,
    const std::function<void(const SimDelivery&)>& on_delivery) {
  return RunSchedulerSim(jobs, options, SimObserver{on_delivery, nullptr});
}

}  // namespace carpool
