// Engine: the server's JobService. It joins the scheduler (DSA rounds, decided queues), the
// shared-memory sample cache, the preparation and assembly workers and the jobs' batch slots.
// docs/server.md describes the threads, the life of a sample and the statistics.
//
// Threads (docs/architecture.md "Threads and locks"): the control plane calls CreateJob from its
// join lane, RemoveJob and Stats from its control lane and Release from its io thread (which
// never waits for the engine's lock); none waits for preparation. One coordinator thread runs
// the scheduler and hands work to a WorkerPool. Per-sample bookkeeping lives in SampleLifecycle,
// and each job's batches come from its BatchSource. Lock order: the engine's mutex, then the
// cache's; a GPU's mutex, then the cache's. Nothing calls up a layer under a lock: the scheduler
// reports next uses to the cache (RefCountSink::NextUseChanged), which ranks evictions, its own
// and the GPUs' resident areas', from what it holds. Thread-safe.
#ifndef CARPOOL_SERVER_ENGINE_H_
#define CARPOOL_SERVER_ENGINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cache/sample_cache.h"
#include "common/mutex.h"
#include "datasets/catalog.h"
#include "datasets/sample_reader.h"
#include "sampler/node_partition.h"
#include "server/batch_pool.h"
#include "server/data_parallel_group.h"
#include "server/engine_samples.h"
#include "server/engine_snapshot.h"
#include "server/fault_injection.h"
#include "server/gpu_service.h"
#include "server/host_cpu.h"
#include "server/job_service.h"
#include "server/prepared_keys.h"
#include "server/sample_lifecycle.h"
#include "server/scheduler.h"
#include "server/transform.h"
#include "server/worker_phases.h"
#include "server/worker_pool.h"

namespace carpool {

struct EngineJob;

inline constexpr uint64_t kDefaultCacheBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint64_t kDefaultLookahead = 0;  // samples; 0: derived (Scheduler)
inline constexpr uint64_t kDefaultGpuCacheBytes = uint64_t{2} << 30;  // 2 GiB per GPU

struct EngineOptions {
  std::string instance = "default";  // names the cache and batch slot segments
  uint64_t cache_bytes = kDefaultCacheBytes;  // 0: no cache, every delivery prepared (baseline)
  cache::EvictionPolicy policy = cache::EvictionPolicy::kRefCnt;
  uint32_t workers = 0;  // 0: the number of cores
  uint64_t lookahead = kDefaultLookahead;  // --lookahead: an override of the derived L
  bool pacing = true;                      // --pacing on|off (docs/scheduler.md "Pacing")
  bool follow = true;  // --follow on|off (docs/scheduler.md "Following a running job")
  uint64_t seed = 1;
  std::chrono::milliseconds tick{5};  // the coordinator's longest sleep between wakes
  std::vector<int> gpus;               // CUDA devices served (--gpus); empty: CPU batches only
  uint64_t gpu_cache_bytes = kDefaultGpuCacheBytes;  // resident sample area per GPU
  // --gpu-decode: GPU jobs' JPEGs decoded on their GPU (decode=gpu keys, docs/gpu.md).
  GpuDecode gpu_decode = GpuDecode::kAuto;
  uint64_t gpu_decode_bytes = uint64_t{512} << 20;  // decoded images held at once per GPU
  // --job-decode: a GPU job's JPEGs decoded in its own process where it offers to (job_decode.h).
  bool job_decode = true;
  // A data-parallel job whose ranks have not all joined this long after its first fails.
  std::chrono::milliseconds rank_join_timeout{60000};
  // The cross-node partition's seed (sampler/node_partition.h): the same on every node of a sweep.
  uint64_t partition_seed = kDefaultPartitionSeed;
  FaultInjection faults;  // tests only: samples whose tasks throw (server/fault_injection.h)
};

class Engine : public JobService {
 public:
  // Opens nothing but the cache segment; `catalog` must outlive the engine.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                const Catalog* catalog);
  ~Engine() override;  // Stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stops the coordinator and the workers. Call after the control plane has stopped (every job
  // removed). Idempotent.
  void Stop();

  Result<protocol::JobInfo> CreateJob(const protocol::CreateJob& request,
                                      std::shared_ptr<JobSink> sink) override;
  // Queues the release for the coordinator (never takes the engine's lock): OK at once; a
  // failure there is logged. O(1).
  Status Release(uint64_t job_id, uint32_t slot, uint64_t generation) override;
  void RemoveJob(uint64_t job_id) override;
  std::string Stats(uint64_t job_id) override;
  // The numbers `Stats(0)` prints, copied under the engine's lock (for /metrics). ~µs per job.
  EngineSnapshot Snapshot() const;

  const std::string& cache_segment() const { return cache_->segment_name(); }
  const EngineOptions& options() const { return options_; }

 private:
  using Job = EngineJob;  // server/engine_job.h
  // One sample of a batch being built: read from the cache (pinned) or prepared by the assembler.
  struct BatchItem {
    uint32_t sample = 0;
    bool pinned = false;
    std::shared_ptr<const SampleSource> source;
    PreparedShape shape;  // of a pinned sample
    int32_t label = -1;
    uint64_t seed = 0;
  };
  struct BatchTask {
    Job* job = nullptr;
    WritableSlot slot;
    uint32_t epoch = 0;
    uint64_t batch_index = 0;
    size_t decisions = 0;  // queue entries this batch consumes
    uint32_t skipped = 0;  // of them, known-bad samples left out
    uint64_t fair_tag = 0;  // its start in samples-fair order (TryBuildBatch)
    uint64_t order = 0;     // the job's builds_taken when taken: it delivers in this order
    bool overlaps = false;  // taken while another of its job's builds was in flight
    std::vector<BatchItem> items;
  };
  // Forwards the scheduler's reference counts to the cache and keeps their total.
  class RefSink : public RefCountSink {
   public:
    void AddRef(SampleId sample, int64_t delta) override;
    void AddRefAll(const Roaring& set, int64_t delta) override;  // one cache lock for the set
    void AddDecided(SampleId sample, int64_t delta) override;
    void NextUseChanged(SampleId sample, double at) override;
    bool WantsNextUses() const override { return next_uses; }
    cache::SampleCache* cache = nullptr;
    bool next_uses = false;  // forward NextUseChanged (next-use policy, or GPUs served)
    int64_t total = 0;  // GUARDED_BY(Engine::mu_): the scheduler only runs under it
  };

  // Where a job starts; a checkpoint's position (CreateJob::resume_*) moves it.
  struct ResumePoint {
    uint32_t epoch = 0;
    uint64_t batch = 0;
    Roaring remaining;          // of that epoch, still to come
    bool nothing_left = false;  // the checkpoint was taken after the job's last batch
  };
  // InvalidArgument naming the problem for a position this job cannot take (another dataset,
  // epochs past the job's, a data-parallel job). O(|ids| + |taken|).
  static Result<ResumePoint> ResumeFrom(const protocol::CreateJob& request, const Roaring& ids,
                                        bool ranked);

  Engine(const EngineOptions& options, const Catalog* catalog);
  double Now() const;
  void Wake();
  void CoordinatorLoop();
  // One coordinator pass: rounds, preparation requests, batches, ends of data.
  void Step() REQUIRES(mu_);
  void ApplyReleases() REQUIRES(mu_);  // the releases queued by Release
  // The scheduler's pacing capacity in samples, from the cache's mean slot. O(1).
  void UpdateCapacity() REQUIRES(mu_);
  void FeedPreparation() REQUIRES(mu_);
  void StartPreparation(uint32_t sample) REQUIRES(mu_);  // REQUIRES: states().NeedsPreparation(sample)
  void TryBuildBatch(Job& job) REQUIRES(mu_);
  void FinishIfDone(Job& job) REQUIRES(mu_);
  // Whether every sample of the job's front batch (`decisions`) is prepared (cached, transient or
  // bad); starts the preparations it lacks. Cost: O(samples not known prepared).
  bool FrontBatchPrepared(Job& job, const std::vector<Decision>& decisions) REQUIRES(mu_);
  void MarkBad(uint32_t sample, const SampleSource& source, const Status& status) REQUIRES(mu_);
  // One user fewer of each of `keys` in the sample table, kTableAddChunk keys per hold of mu_ so
  // that a 1.28M-sample job's removal never holds up another's batches, removal or stats by more
  // than one part. Returns how many samples were dropped.
  size_t ReleaseTable(const Roaring& keys) EXCLUDES(mu_);
  static constexpr std::chrono::milliseconds kDecideSlice{5};  // Tick's time per Step
  static constexpr size_t kTableAddChunk = 16384;  // samples per hold of mu_: CreateJob, ReleaseTable
  static constexpr size_t kTrimAfterSamples = 10000;  // released at once: return the heap (RemoveJob)

  // Adds `job` (a rank) to its key's group; the last rank to join adds the group to the scheduler.
  // `ids`: this node's part of the dataset; `batches_per_epoch`: what every node agreed on.
  Status JoinGroup(Job& job, const Roaring& ids, uint64_t batches_per_epoch) REQUIRES(mu_);
  // Logs a bookkeeping transition that failed (a bug, never expected).
  void Check(const Status& transition) const REQUIRES(mu_);

  // Fails a job (every rank of a data-parallel one) with `why`: its decisions and references go
  // now, the client hears the error, and the job stays until its client leaves.
  void FailJob(Job& job, const Status& why) REQUIRES(mu_);

  // Worker tasks (engine_tasks.cc). Each is a fault barrier: a data error skips the sample, and any
  // other throw fails the jobs the task serves and gives back what it held (docs/server.md).
  void Prepare(uint32_t sample, std::shared_ptr<const SampleSource> source);
  void Assemble(BatchTask task);
  struct PrepareProgress {
    bool allocated = false;  // holds a cache allocation not yet committed
    bool finished = false;   // its state is updated: nothing is left to give back
  };
  void PrepareInCache(uint32_t sample, const SampleSource& src, PrepareProgress& progress);
  // A throw out of PrepareInCache: aborts its allocation and marks the sample faulted.
  void PrepareFaulted(uint32_t sample, const SampleSource& src, const PrepareProgress& progress,
                      std::string_view what);
  // Assemble's first part: the batch's images transformed into its slot (host or device).
  struct AssembleResult {
    bool released = false;  // let the job's next build start (job_work_sent) before its end
    std::vector<PreparedView> views;
    std::vector<PreparedImage> owned;  // samples prepared here (views point into it)
    std::vector<uint32_t> ids;         // keys, then catalog ids once written
    std::vector<int32_t> labels;
    std::vector<uint64_t> seeds;
    std::vector<std::pair<uint32_t, Status>> unreadable;
    std::optional<Status> misfit;  // the first sample its transform cannot take: fails the job
    uint32_t skipped = 0;
    uint64_t transient = 0;
    uint32_t n = 0;  // samples in the published batch
  };
  void AssembleInto(const BatchTask& task, AssembleResult& out);
  // Prepares one sample outside the cache (no cache, or no room): counts a preparation.
  Result<PreparedImage> PrepareTransient(const SampleSource& source);

  JobSnapshot SnapshotJob(const Job& job) const REQUIRES(mu_);  // engine_stats.cc
  EngineSnapshot SnapshotLocked() const REQUIRES(mu_);
  GpuService* ServedGpu(int device) const;     // null when not served
  // "cpu" -> -1, "cuda" / "cuda:N" -> N; the error names the devices served.
  Result<int> ParseDevice(const std::string& device) const;

  const EngineOptions options_;
  const Catalog* catalog_;
  Mutex catalog_mu_;  // the catalog is thread-compatible; taken alone (before mu_ if ever both)
  SampleReader reader_;
  const std::chrono::steady_clock::time_point start_;

  mutable Mutex mu_ ACQUIRED_AFTER(catalog_mu_);
  std::condition_variable wake_;       // the coordinator waits on it
  std::condition_variable assembled_;  // RemoveJob waits on it for the job's batch in flight
  bool woken_ GUARDED_BY(mu_) = false;
  struct PendingRelease {
    uint64_t job_id;
    uint32_t slot;
    uint64_t generation;
  };
  Mutex releases_mu_ ACQUIRED_AFTER(mu_);  // a leaf: nothing else is taken under it
  std::vector<PendingRelease> releases_ GUARDED_BY(releases_mu_);
  std::atomic<bool> releases_pending_{false};
  bool stop_ GUARDED_BY(mu_) = false;
  RefSink refs_;
  std::unique_ptr<Scheduler> scheduler_ GUARDED_BY(mu_);
  HostCpu host_cpu_ GUARDED_BY(mu_);           // the spare CPU share for the pacing's lift
  std::unique_ptr<cache::SampleCache> cache_;  // thread-safe; a leaf: it calls nobody back
  // Thread-safe; after cache_ (its registration of the segment goes first) and before jobs_
  // (their device slots go first). Lock order: a GPU's own mutex, then the cache's (next uses).
  std::vector<std::unique_ptr<GpuService>> gpus_;
  PreparedKeys keys_ GUARDED_BY(mu_);  // a prepare spec's key base
  // Users, state and orphans of every sample key (server/sample_lifecycle.h).
  SampleLifecycle samples_ GUARDED_BY(mu_){[this](uint32_t key) { return cache_->Holds(key); }};
  std::map<uint64_t, std::unique_ptr<Job>> jobs_ GUARDED_BY(mu_);
  // Data-parallel jobs by job key; each rank's BatchSource points into its group.
  std::map<std::string, std::unique_ptr<DataParallelGroup>> groups_ GUARDED_BY(mu_);
  uint32_t next_job_id_ GUARDED_BY(mu_) = 1;
  size_t prep_outstanding_ GUARDED_BY(mu_) = 0;
  uint64_t most_entries_ GUARDED_BY(mu_) = 0;  // the most samples the cache has held
  // Counters.
  uint64_t preparations_ GUARDED_BY(mu_) = 0;
  uint64_t transient_preparations_ GUARDED_BY(mu_) = 0;
  // decode=gpu samples the workers prepared on the CPU (PNGs, progressive JPEGs, ...).
  uint64_t gpu_decode_cpu_fallbacks_ GUARDED_BY(mu_) = 0;
  uint64_t deliveries_ GUARDED_BY(mu_) = 0;
  uint64_t batches_ GUARDED_BY(mu_) = 0;
  uint64_t skipped_ GUARDED_BY(mu_) = 0;
  uint64_t pins_ GUARDED_BY(mu_) = 0;  // pins held by batches being assembled
  // Samples-fair queuing of assemblies: the start tag of the latest one finished.
  uint64_t fair_clock_ GUARDED_BY(mu_) = 0;
  uint64_t jobs_created_ GUARDED_BY(mu_) = 0, jobs_removed_ GUARDED_BY(mu_) = 0;
  double coordinator_seconds_ GUARDED_BY(mu_) = 0;  // in Step: the engine's serial part
  // Time worker tasks waited to take mu_ (WorkerLock): contention on the engine's lock.
  std::atomic<uint64_t> worker_lock_wait_ns_{0};
  // Holds mu_ for its scope; a worker's wait to take it is counted.
  class SCOPED_CAPABILITY WorkerLock {
   public:
    explicit WorkerLock(Engine& engine) ACQUIRE(engine.mu_);
    ~WorkerLock() RELEASE();
    WorkerLock(const WorkerLock&) = delete;
    WorkerLock& operator=(const WorkerLock&) = delete;

   private:
    Engine& engine_;
  };
  WorkerPhases phases_;  // workers in each phase of their tasks, for the stats

  std::unique_ptr<WorkerPool> workers_;
  std::thread coordinator_;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_ENGINE_H_
