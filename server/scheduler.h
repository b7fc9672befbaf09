// Scheduler: decides, round by round, which jobs take part in the DSA and keeps each job's decided
// queue (docs/scheduler.md "Tick: trigger and participation"). Pure code driven by a clock that
// the caller passes in (seconds in the server, ticks in `carpool sim`): no threads, no sleeps, so
// the server and the simulator run the same code.
//
// - Trigger: Tick runs rounds while some job that still has work has fewer than its prefetch
//   depth of decided samples.
// - Participation: every job with fewer than min(L, its dataset's size + 2 x its prefetch)
//   decided samples takes part in each of those rounds (L the look-ahead): a job already at L, or
//   an epoch of its own dataset ahead of its deliveries, is masked.
// - Following: a fresh job's first epoch may copy a running job's order of their common samples,
//   its own samples at coin-tossed positions, so a job joining mid-epoch takes samples with it
//   (docs/scheduler.md "Following a running job"). Every epoch stays a uniform permutation and
//   later epochs are plain DSA, independent of the first.
// - Rates: each job's consumption rate is an exponentially weighted measure of its deliveries
//   over the clock; before the first measurement a job is assumed as fast as the measured jobs.
// - Reference counts: (jobs whose R holds the sample) + (decided-queue entries holding it). Every
//   change goes to a RefCountSink: AddJob +1 per id, a decision 0 (R -> queue), a delivery -1, an
//   epoch reset +1 per id, RemoveJob -1 per id left in R and per queue entry, a tail given back
//   at a join 0 (queue -> R; its decided count -1).
// - Next use (cache::NextUseOracle, the simulator's live oracle): min over jobs of (position in
//   its queue) / (its rate), and for a job that has not decided the sample yet, its expected
//   position (uniform over R, or over the next epoch) / its rate. The server's cache gets each
//   decided sample's estimate pushed instead (RefCountSink::NextUseChanged) and never calls back.
//
// Thread-compatible: callers serialize access. Its sink's calls go down into the cache under the
// caller's lock (the engine's, then the cache's).
#ifndef CARPOOL_SERVER_SCHEDULER_H_
#define CARPOOL_SERVER_SCHEDULER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <roaring/roaring.hh>
#include <unordered_map>
#include <vector>

#include "cache/cache_index.h"
#include "carpool/status.h"
#include "sampler/rng.h"
#include "sampler/sampling_tree.h"

namespace carpool {

// Receives every reference-count change the scheduler makes.
class RefCountSink {
 public:
  virtual ~RefCountSink() = default;
  virtual void AddRef(SampleId sample, int64_t delta) = 0;
  // The same change for every sample of `set` (a job joining, an epoch starting): one call, so a
  // sink can take its lock once. Default: AddRef per sample.
  virtual void AddRefAll(const Roaring& set, int64_t delta) {
    for (uint32_t s : set) AddRef(s, delta);
  }
  // Decided-queue entries holding the sample: +1 per decision, -1 per delivery or removal. The
  // cache evicts a sample no queue holds before one that some job has decided (it is needed soon).
  // Default: ignored.
  virtual void AddDecided(SampleId /*sample*/, int64_t /*delta*/) {}
  // The earliest time (the scheduler's clock) at which a decided queue is expected to deliver the
  // sample, each entry estimated when it was decided (its position over its job's rate then);
  // +infinity once no queue holds it. Called after each decision, delivery or removal of an entry,
  // so that a cache can rank samples by next use from values it holds, never asking the scheduler
  // back under its own lock. Default: ignored.
  virtual void NextUseChanged(SampleId /*sample*/, double /*at*/) {}
  // Whether NextUseChanged is read: if not, the scheduler does not compute the estimates (one per
  // decision and delivery).
  virtual bool WantsNextUses() const { return false; }
};

// Forwards reference counts to anything with `AddRef(uint32_t, int64_t)`: cache::CacheIndex (the
// simulator) or cache::SampleCache (the server). REQUIRES: `target` outlives the adapter.
template <typename Target>
class RefCountForwarder : public RefCountSink {
 public:
  explicit RefCountForwarder(Target* target) : target_(target) {}
  void AddRef(SampleId sample, int64_t delta) override { (void)target_->AddRef(sample, delta); }
  void AddDecided(SampleId sample, int64_t delta) override {
    (void)target_->AddDecided(sample, delta);
  }
  void NextUseChanged(SampleId sample, double at) override {
    if constexpr (requires { target_->SetNextUse(sample, at); }) target_->SetNextUse(sample, at);
  }
  bool WantsNextUses() const override {
    return requires(SampleId s, double at) { target_->SetNextUse(s, at); };
  }

 private:
  Target* target_;
};

// One decided sample of a job, and the job's epoch (0-based) it belongs to.
struct Decision {
  SampleId sample;
  uint32_t epoch;
  bool operator==(const Decision&) const = default;
};

// The look-ahead with pacing off and no --lookahead: the fixed default of the server before
// pacing, so that `--pacing off` compares with it.
inline constexpr uint64_t kLookaheadWithoutPacing = 1024;

struct SchedulerOptions {
  uint64_t seed = 1;  // the sampling tree's generator
  // L, in samples. 0: derived (EffectiveLookahead): the pacing window plus twice the largest
  // prefetch depth, so that jobs inside the window never get masked from a round; with pacing
  // off, kLookaheadWithoutPacing.
  uint64_t lookahead = 0;
  // Time constant of the rate measure, in clock units: deliveries older than a few of these no
  // longer matter.
  double rate_time_constant = 10.0;
  // Assumed rate (samples per clock unit) of a new job when no job has been measured yet.
  double prior_rate = 1.0;
  // Coupled pacing (docs/scheduler.md "Pacing"): a job may not be the first to take samples that
  // other jobs still have to deliver while those owed samples would outgrow the window.
  bool pacing = true;
  // The pacing lifts for a job whose every lagging sharer waits on its own client (no free batch
  // slot) at least this fraction of the time, measured over `bound_time_constant`: the laggers
  // are slower by nature, and the server has slack to prepare their samples again.
  double lift_fraction = 0.5;
  double bound_time_constant = 2.0;  // clock units
  // ... and only for a leader consistently faster by nature than each such lagger: its pace
  // (samples per clock unit of the time its client had a batch, JobStats::pace) at least
  // (1 + faster_margin) times theirs, measured over `pace_time_constant`. Without it, clients
  // starved for CPU (training beside the server on few cores) all count as client-bound, and
  // every jitter lead escapes the window (an Optuna sweep of 8 trials on 2 cores: 5,330 lifts).
  double faster_margin = 0.2;
  double pace_time_constant = 5.0;  // clock units
  // ... and only while other processes leave at least this share of the CPU (idle, or used by
  // the server itself: HostCpu, SetSpareCpu; DESIGN.md: the lift pays for re-preparations "with
  // spare CPU only"). Where training processes fill the CPU a leader ahead by the OS's luck has
  // the pace of one faster by nature, and holding it gives its CPU to its laggers. Not known
  // (never set): no such condition.
  double lift_spare_cpu = 0.1;
  // Following (docs/scheduler.md "Following a running job"): a new job's first epoch copies a
  // running job's draws of the samples they have in common, in that job's order, so the two
  // take them together even though the new job joined mid-epoch. Its own samples fall at
  // uniformly random positions, so the permutation stays uniform; later epochs are plain DSA.
  bool follow = true;
};

// What a job's client was doing since the engine last looked (Scheduler::NoteClient).
enum class ClientState {
  kStarved,         // every batch slot free: it has nothing to train on and waits for the server
  kWaitingOnServer, // some slots free: it trains while the server fills the others
  kBound,           // every slot full: its own client is the bound
};

// The state of a client with `free` of its `slots` batch slots free. O(1).
inline ClientState ClientStateOfSlots(size_t free, size_t slots) {
  return free == 0       ? ClientState::kBound
         : free == slots ? ClientState::kStarved
                         : ClientState::kWaitingOnServer;
}

// The pacing's state, for status and /metrics.
struct PacingStats {
  bool enabled = false;
  uint64_t capacity = 0;   // cache capacity in samples (0: not known yet, no pacing)
  uint64_t window = 0;     // owed samples allowed: capacity - pinned, at least one batch
  uint64_t owed = 0;       // samples delivered to some job and still queued for another
  uint64_t lookahead = 0;  // L in force (derived or the override)
  bool derived_lookahead = false;
  uint64_t holds = 0;      // batches refused by MayTake (each refusal counted once per batch)
  uint64_t lifts = 0;      // batches let go past the window for a consistently faster job
  double spare_cpu = -1;   // CPU share other processes leave (SetSpareCpu); -1: not known
};

class Scheduler : public cache::NextUseOracle {
 public:
  struct JobStats {
    uint32_t epoch = 0;  // epoch being decided (0-based); == epochs once all decided
    uint32_t epochs = 0;
    uint64_t remaining = 0;  // |R| of the epoch being decided
    uint64_t queued = 0;     // decided, not yet delivered
    uint64_t delivered = 0;
    uint64_t prefetch = 0;
    double rate = 0;        // samples per clock unit
    bool measured = false;  // false: `rate` is the prior
    double held = 0;        // clock units spent held back by the pacing
    uint64_t behind = 0;    // queue entries whose sample another job already delivered
    double client_bound = 0;  // fraction of recent time waiting on its own client
    // Its natural speed: samples per clock unit of the time its client was not starved (0: not
    // measured yet). Holding a job starves it, so unlike `rate` the pacing does not lower this.
    double pace = 0;
    // The job whose draws it copies in its first epoch (Following), if any.
    std::optional<JobId> leader;
    uint64_t followed = 0;  // decisions copied from a leader so far
  };

  // REQUIRES: `sink` (may be null: counts are not reported) outlives the scheduler.
  Scheduler(const SchedulerOptions& options, RefCountSink* sink);
  ~Scheduler() override;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Sets the sink after construction, for when the sink's target needs the scheduler first
  // (SampleCache takes the scheduler as its NextUseOracle). FailedPrecondition once jobs exist:
  // their counts would be missing from the new sink.
  Status SetRefCountSink(RefCountSink* sink);

  // Adds a job over `dataset` for `epochs` epochs that wants `prefetch_samples` decided samples
  // ahead (clamped to L). Errors: duplicate id, empty dataset, epochs or prefetch of 0.
  Status AddJob(JobId job, const Roaring& dataset, uint32_t epochs, uint64_t prefetch_samples,
                double now);
  // Where a job resumed from a checkpoint starts: in epoch `epoch` (< epochs) with `remaining`,
  // a non-empty part of the dataset, left to decide in it.
  struct Start {
    uint32_t epoch = 0;
    const Roaring* remaining = nullptr;  // null: the whole dataset
  };
  Status AddJob(JobId job, const Roaring& dataset, uint32_t epochs, uint64_t prefetch_samples,
                double now, const Start& start);
  // Removes a job: its R and its queue release their references. Error: unknown id.
  Status RemoveJob(JobId job);
  // A job has joined: every other job whose dataset overlaps its own gives back the tail of its
  // queue in its current epoch beyond its first keep(job) entries (the batch being built, which
  // the caller must not lose), so that the next rounds decide those samples jointly with the new
  // job. Without it the first job to connect keeps thousands of samples decided alone, which
  // the others must draw on their own later: four jobs started together ran 4,000 samples apart
  // with the GPU's area holding 1,250 (docs/scheduler.md "Joining"). The cut depends on
  // positions only, so every permutation stays uniform. keep() returning UINT64_MAX exempts a
  // job. Returns the decisions given back. With pacing off: nothing (the server as before).
  // Cost: O(entries given back) plus one tree re-insertion per job cut.
  uint64_t UndecideTails(JobId joined, const std::function<uint64_t(JobId)>& keep);

  // Runs rounds while some job with work left is below its prefetch depth; each round includes
  // every job below L (starting its next epoch first when its R is empty). Appends the rounds'
  // assignments to `decided` when non-null. Returns the number of rounds run. With a `deadline`,
  // stops after the round that passes it (a job joining decides its prefetch depth over several
  // calls, so its caller's lock is not held for all of it); cut_short() then says so.
  uint64_t Tick(double now, std::vector<Assignment>* decided = nullptr,
                std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
  // Whether the last Tick stopped at its deadline with rounds still due.
  bool cut_short() const { return cut_short_; }

  // The job's next batch after the first `skip` queued decisions (batches taken, not yet
  // consumed): the next min(b, k), k = how many from there share its epoch. Returns false, with
  // `out` empty, while fewer than b are queued there and that epoch still has undecided samples
  // (run Tick). True with a short batch at an epoch's end. O(b).
  bool NextBatch(JobId job, size_t b, std::vector<Decision>* out, size_t skip = 0) const;
  // The whole decided queue, front first; nullptr for an unknown job. Valid until a mutation.
  const std::deque<Decision>* Queue(JobId job) const;
  // Delivers the first `n` queued decisions (n <= queue size): one reference each, and the rate
  // measure. Errors: unknown id, n larger than the queue.
  Status Consume(JobId job, size_t n, double now);
  // True once every epoch is decided and delivered; the engine then removes the job.
  bool Finished(JobId job) const;

  // Pacing. The cache's capacity in samples (0: unknown, no pacing); the engine derives it from
  // the cache bytes and the mean prepared sample. O(1).
  void SetCapacity(uint64_t samples);
  // The job's batch size. With pacing on, the trigger depth becomes
  // clamp(capacity / (2 x jobs), batch, prefetch), and one batch while the capacity is unknown,
  // instead of the whole prefetch depth. O(log jobs).
  void SetBatch(JobId job, uint64_t batch);
  uint64_t capacity() const { return capacity_; }
  // How many queue entries NextToPrepare may look at when preparing ahead, with `occupied`
  // samples in the cache (cached and in flight): the capacity while it has empty room, and once
  // it is full the jobs' prefetch depths added up (what their clients can take next), since each
  // sample prepared further ahead evicts one no job has decided but some job may still draw.
  // Without a known capacity, no limit. O(jobs).
  uint64_t PrepareAheadHorizon(uint64_t occupied) const;
  // The share of the CPU other processes leave now (HostCpu), for the lift; nullopt: not known.
  // O(1).
  void SetSpareCpu(std::optional<double> idle) { spare_cpu_ = idle; }
  // Whether the job may take (assemble and then deliver) its first `n` queued decisions now, with
  // `pinned` cache samples pinned by batches in flight. True when pacing is off, the capacity is
  // unknown, none of them would become owed (no other queue holds them, or another job already
  // took them), the owed samples stay within the window, the job is at least as far behind
  // (queued samples others took) as each job it would lead, or those jobs are all client-bound
  // and slower by nature than this one (SchedulerOptions::faster_margin). A refusal starts (or
  // continues) the job's held time; a grant ends it.
  // Cost: O(n x queue entries of those samples).
  // `skip`: the queued decisions of the job's batches taken and not yet consumed; the batch is
  // the n after them.
  bool MayTake(JobId job, size_t n, uint64_t pinned, double now, size_t skip = 0);
  // What the job's client is doing since the last call; feeds the decayed client-bound
  // fraction and the pace that together lift the pacing. O(1).
  void NoteClient(JobId job, ClientState state, double now);
  PacingStats pacing() const;
  // The look-ahead in force: the override, or the window plus twice the largest prefetch depth
  // (at least 64). O(jobs).
  uint64_t EffectiveLookahead() const;

  // Earliest deadline first: appends to `out` up to `k` distinct queued samples for which
  // `ready(sample)` is false (not cached, not in flight), by deadline = position in a job's queue
  // / that job's rate (the earliest over jobs). Looks at most at `horizon` queue entries in all.
  // ready_persists: the caller promises that a queued sample once ready stays ready; each job's
  // walk then starts after the prefix of its queue found ready before. Cost: O(entries looked
  // at x log jobs), which without the promise includes every ready entry ahead of the first
  // unready one.
  void NextToPrepare(size_t k, const std::function<bool(SampleId)>& ready,
                     std::vector<SampleId>* out, size_t horizon = SIZE_MAX,
                     bool ready_persists = false) const;

  // cache::NextUseOracle: clock units from now until the first job delivers `sample`, judged by
  // the rates: min over jobs of (queue position) / rate for a queued sample, else the expected
  // position (|queue| + (|R| + 1) / 2) / rate for a sample in the job's R, else for a sample of
  // its dataset in a later epoch (|queue| + |R| + (|D| + 1) / 2) / rate. +infinity when no job
  // will need it. Cost: O(queue entries of the sample + jobs) bitmap lookups.
  double NextUse(uint32_t sample) const override;

  bool Contains(JobId job) const { return jobs_.count(job) != 0; }
  size_t size() const { return jobs_.size(); }
  std::vector<JobId> Jobs() const;  // ascending ids
  Result<JobStats> Stats(JobId job) const;
  uint64_t lookahead() const { return EffectiveLookahead(); }
  uint64_t rounds() const { return rounds_; }
  uint64_t followed() const { return followed_; }  // decisions copied from leaders, all jobs
  const SamplingTree& tree() const { return tree_; }

 private:
  struct Job;
  // One queue entry of a sample, for next-use: the job and the entry's absolute sequence number.
  struct Use {
    Job* job;
    uint64_t seq;
    double at;  // the clock when it was decided plus its position over the job's rate then
  };

  static double EarliestUse(const std::vector<Use>& uses);  // +infinity for none
  Job* Find(JobId job) const;
  bool HasWork(const Job& job) const;
  uint64_t Trigger(const Job& job) const;  // the queue depth below which Tick runs rounds
  // Starts the job's next epoch when its R is empty and it has epochs left.
  void MaybeResetEpoch(Job& job);
  // Recomputes every job's rate at the clock `now_`; unmeasured jobs get the measured mean.
  void RefreshRates();
  // Decays the job's pace measure to `now`.
  void DecayPace(Job& job, double now) const;
  void AddUse(SampleId sample, Job* job, uint64_t seq);
  void DropUse(SampleId sample, const Job* job, uint64_t seq);
  void Report(SampleId sample, int64_t delta) const;
  void ReportDecided(SampleId sample, int64_t delta) const;
  uint64_t Window(uint64_t batch, uint64_t pinned) const;
  uint64_t MaxPrefetch() const;  // over the jobs: O(jobs)
  void ReportAll(const Roaring& set, int64_t delta) const;
  // Following: picks the leader of a job's first epoch (the running job, not itself following,
  // whose draws would give it the most common samples), or none. O(jobs) bitmap operations.
  void StartFollowing(Job& job);
  void StopFollowing(Job& job);
  // Before a round: the leader moved into its next epoch (the rest of the common samples follow
  // its new order) or left. O(1), or one bitmap difference at the switch.
  void UpdateFollowing(Job& job);
  // After the tree's round: the leaders' draws go to their followers, then each follower takes
  // its steps. O(followers x (draws taken + log)).
  void FollowersTakeSteps(uint64_t lookahead);
  // A follower that stopped while its coin owed a common step takes it: a sample uniform over
  // the common ones left in R (less `took`, this round's). Then it is plain. O(R) bitmap work.
  void TakeClosingStep(Job& job, Roaring& took);
  // One decision: the queue entry, its use and its decided count.
  void Decide(Job& job, SampleId sample);
  // A follower's step: Decide, and its assignment for Tick's caller (with the leader's when it
  // drew the sample in this round; a follower's assignments of one round may be out of its order).
  void DecideStep(Job& job, SampleId sample, bool followed);

  SchedulerOptions options_;
  RefCountSink* sink_;
  SamplingTree tree_;
  std::map<JobId, std::unique_ptr<Job>> jobs_;           // ordered: reproducible rounds
  std::unordered_map<SampleId, std::vector<Use>> uses_;  // samples held by some queue
  // Owed samples: delivered to some job and still in another's queue (they must stay cached for
  // the sharing to pay off).
  std::unordered_map<SampleId, uint32_t> owed_;  // sample -> 1 (a set with O(1) erase)
  uint64_t capacity_ = 0;
  uint64_t last_pinned_ = 0;
  uint64_t last_batch_ = 0;  // of the latest MayTake, for the window shown
  uint64_t holds_ = 0, lifts_ = 0;
  std::optional<double> spare_cpu_;  // SetSpareCpu
  uint64_t rounds_ = 0;
  double now_ = 0;
  bool cut_short_ = false;
  // Scratch space of Tick.
  std::vector<JobId> participants_;
  std::vector<const Job*> laggers_;  // MayTake's
  std::vector<Assignment> round_;
  std::vector<Job*> followers_;  // this round's, not masked
  size_t tree_drawn_ = 0;        // round_'s first entries: the tree's assignments
  Rng follow_rng_;               // the followers' coins and own draws
  uint64_t followed_ = 0;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_SCHEDULER_H_
