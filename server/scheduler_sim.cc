#include "server/scheduler_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>

#include "server/belady.h"
#include "server/scheduler.h"

namespace carpool {

namespace {

Status Validate(const std::vector<SimJobSpec>& jobs, const SchedulerSimOptions& options) {
  if (jobs.empty()) return Status::InvalidArgument("no job to simulate; give at least one --job");
  if (options.lookahead == 0 || options.prefetch == 0) {
    return Status::InvalidArgument(
        fmt::format("--lookahead ({}) and --prefetch ({}) must be at least 1 sample",
                    options.lookahead, options.prefetch));
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

// The simulation's state; one instance per run.
class Sim {
 public:
  Sim(const std::vector<SimJobSpec>& specs, const SchedulerSimOptions& options,
      const std::function<void(const SimDelivery&)>& on_delivery)
      : specs_(specs),
        options_(options),
        on_delivery_(on_delivery),
        index_(cache::CacheIndex::Options{options.policy, options.cache_samples, 0}, &scheduler_),
        refs_(&index_),
        scheduler_(
            SchedulerOptions{options.seed, options.lookahead, options.rate_time_constant, 1.0},
            &refs_),
        jobs_(specs.size()) {
    result_.jobs.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) result_.jobs[i].name = specs[i].name;
  }

  Result<SchedulerSimResult> Run() {
    size_t finished = 0;
    uint64_t t = 0;
    for (; finished < specs_.size(); ++t) {
      for (size_t i = 0; i < specs_.size(); ++i) {
        JobState& job = jobs_[i];
        if (job.state == kWaiting && specs_[i].start <= static_cast<double>(t)) {
          Status s = scheduler_.AddJob(Id(i), specs_[i].dataset, specs_[i].epochs,
                                       options_.prefetch, static_cast<double>(t));
          if (!s.ok()) return s;
          job.state = kRunning;
        }
      }
      for (size_t i = 0; i < specs_.size(); ++i) {
        if (jobs_[i].state != kRunning) continue;
        Status s = DeliverBatch(i, t);
        if (!s.ok()) return s;
        if (scheduler_.Finished(Id(i))) {
          s = scheduler_.RemoveJob(Id(i));
          if (!s.ok()) return s;
          jobs_[i].state = kDone;
          result_.jobs[i].finish_tick = t;
          ++finished;
        }
      }
      Decide(t);
    }
    result_.ticks = t;
    result_.rounds = scheduler_.rounds();
    const cache::IndexStats stats = index_.stats();
    result_.evictions = stats.evictions;
    result_.belady_preparations = BeladyMin(requests_, options_.cache_samples).misses;
    if (options_.keep_requests) result_.requests = std::move(requests_);
    return std::move(result_);
  }

 private:
  enum State { kWaiting, kRunning, kDone };
  struct JobState {
    State state = kWaiting;
    double credit = 0;
    std::deque<bool> shared;  // parallel to the job's decided queue: drawn in a shared round
  };

  static JobId Id(size_t i) { return static_cast<JobId>(i + 1); }

  void Decide(uint64_t t) {
    decided_.clear();
    scheduler_.Tick(static_cast<double>(t), &decided_);
    for (const Assignment& a : decided_) {
      for (JobId id : a.jobs) jobs_[id - 1].shared.push_back(a.jobs.size() > 1);
    }
  }

  // The deliveries the job is owed this tick, as one batch pinned until it is complete.
  Status DeliverBatch(size_t i, uint64_t t) {
    JobState& job = jobs_[i];
    SchedulerSimResult::Job& out = result_.jobs[i];
    job.credit += specs_[i].speed;
    pinned_.clear();
    while (job.credit >= 1.0) {
      const std::deque<Decision>* queue = scheduler_.Queue(Id(i));
      if (queue->empty()) Decide(t);
      if (queue->empty()) {  // every epoch delivered
        job.credit = 0;
        break;
      }
      const Decision d = queue->front();
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
        pinned_.push_back(d.sample);
      }
      result_.hits += hit;
      ++result_.deliveries;
      ++out.deliveries;
      result_.shared_deliveries += job.shared.front();
      job.shared.pop_front();
      out.epochs = std::max(out.epochs, d.epoch);  // every earlier epoch is complete
      requests_.push_back(d.sample);
      if (on_delivery_) on_delivery_(SimDelivery{t, i, d.epoch, d.sample, hit});
      Status s = scheduler_.Consume(Id(i), 1, static_cast<double>(t));
      if (!s.ok()) return s;
      job.credit -= 1.0;
    }
    for (SampleId s : pinned_) {
      Status st = index_.Unpin(s);
      if (!st.ok()) return st;
    }
    if (scheduler_.Finished(Id(i))) out.epochs = specs_[i].epochs;
    return Status::OK();
  }

  const std::vector<SimJobSpec>& specs_;
  const SchedulerSimOptions& options_;
  const std::function<void(const SimDelivery&)>& on_delivery_;
  // Construction order matters: the index asks the scheduler for next uses, the scheduler sends
  // reference counts to the index. Neither calls the other while being constructed.
  cache::CacheIndex index_;
  RefCountForwarder<cache::CacheIndex> refs_;
  Scheduler scheduler_;
  std::vector<JobState> jobs_;
  SchedulerSimResult result_;
  std::vector<SampleId> requests_;
  std::vector<Assignment> decided_;
  std::vector<SampleId> pinned_;
  std::vector<cache::CacheIndex::Evicted> evicted_;
};

}  // namespace

Result<SchedulerSimResult> RunSchedulerSim(
    const std::vector<SimJobSpec>& jobs, const SchedulerSimOptions& options,
    const std::function<void(const SimDelivery&)>& on_delivery) {
  Status s = Validate(jobs, options);
  if (!s.ok()) return s;
  Sim sim(jobs, options, on_delivery);
  return sim.Run();
}

}  // namespace carpool
