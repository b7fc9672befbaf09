// The engine's coordinator: its creation, the coordinator loop and one pass of it (rounds,
// preparation, batches), and the orders it hands the workers.
#include "server/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include <opencv2/core.hpp>

#include "common/log.h"
#include "server/engine_job.h"
#include "server/thread_name.h"

namespace carpool {

void Engine::RefSink::AddRef(SampleId sample, int64_t delta) {
  total += delta;
  if (cache != nullptr) (void)cache->AddRef(sample, delta);
}

void Engine::RefSink::AddDecided(SampleId sample, int64_t delta) {
  if (cache != nullptr) (void)cache->AddDecided(sample, delta);
}

void Engine::RefSink::NextUseChanged(SampleId sample, double at) {
  if (cache != nullptr) cache->SetNextUse(sample, at);
}

void Engine::RefSink::AddRefAll(const Roaring& set, int64_t delta) {
  total += delta * static_cast<int64_t>(set.cardinality());
  if (cache == nullptr) return;
  std::vector<uint32_t> ids(set.cardinality());
  set.toUint32Array(ids.data());
  cache->AddRefs(ids, delta);
}

Engine::Engine(const EngineOptions& options, const Catalog* catalog)
    : options_(options), catalog_(catalog), start_(std::chrono::steady_clock::now()) {}

// Not analyzed: the new object is not shared yet, so its guarded members need no lock.
Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                               const Catalog* catalog) NO_THREAD_SAFETY_ANALYSIS {
  std::unique_ptr<Engine> e(new Engine(options, catalog));
  SchedulerOptions so;
  so.seed = options.seed;
  so.lookahead = options.lookahead;  // 0: derived from the cache and the jobs
  so.pacing = options.pacing;
  so.follow = options.follow;
  e->scheduler_ = std::make_unique<Scheduler>(so, &e->refs_);
  cache::CacheOptions co;
  co.instance = options.instance;
  co.capacity_bytes = options.cache_bytes;
  co.policy = options.policy;
  co.clock_origin = e->start_;  // the scheduler's clock: Engine::Now()
  Result<std::unique_ptr<cache::SampleCache>> cache = cache::SampleCache::Create(co);
  if (!cache.ok()) return cache.status();
  e->cache_ = std::move(*cache);
  e->refs_.cache = e->cache_.get();
  GpuServiceOptions go;
  go.devices = options.gpus;
  go.resident_bytes = options.gpu_cache_bytes;
  go.gpu_decode = options.gpu_decode;
  go.decode_bytes = options.gpu_decode_bytes;
  go.host_region = e->cache_->Mapping();
  // Next uses as the scheduler last reported them to the cache: a GPU never takes the engine's
  // lock, only the cache's (a leaf).
  go.next_use = [cache = e->cache_.get()](std::span<const uint32_t> samples,
                                          std::span<double> out) { cache->NextUses(samples, out); };
  Result<std::vector<std::unique_ptr<GpuService>>> gpus = CreateGpuServices(go);
  if (!gpus.ok()) return gpus.status();
  e->gpus_ = std::move(*gpus);
  // Only the next-use policy and the GPUs' resident areas read next uses: spare the others a
  // cache lock per decision and delivery.
  e->refs_.next_uses = options.policy == cache::EvictionPolicy::kNextUse || !e->gpus_.empty();
  uint32_t workers = options.workers;
  if (workers == 0) workers = std::max(1u, std::thread::hardware_concurrency());
  // Parallelism comes from the pool; OpenCV's own threads would only oversubscribe the cores.
  // Set once, here: the setting is process-wide, and OpenCV's TBB backend crashed (H100, 16
  // workers) when every worker called cv::setNumThreads at once as it started.
  cv::setNumThreads(1);
  e->workers_ = std::make_unique<WorkerPool>(workers, [] { NameThisThread("carpool-worker"); });
  e->coordinator_ = std::thread([raw = e.get()] {
    NameThisThread("carpool-coord");
    raw->CoordinatorLoop();
  });
  return e;
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  {
    MutexLock lock(mu_);
    if (stop_ && !coordinator_.joinable()) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (coordinator_.joinable()) coordinator_.join();
  if (workers_) workers_->Shutdown();
}

double Engine::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Engine::Wake() {
  {
    MutexLock lock(mu_);
    woken_ = true;
  }
  wake_.notify_one();
}

Status Engine::Release(uint64_t job_id, uint32_t slot, uint64_t generation) {
  // Queued for the coordinator: the io thread never waits for the engine's lock, which a join
  // of a large dataset holds for a while (Scheduler::AddJob counts a reference per sample).
  {
    MutexLock lock(releases_mu_);
    releases_.push_back({job_id, slot, generation});
  }
  releases_pending_.store(true, std::memory_order_release);
  wake_.notify_one();
  return Status::OK();
}

void Engine::ApplyReleases() {
  if (!releases_pending_.exchange(false, std::memory_order_acq_rel)) return;
  std::vector<PendingRelease> batch;
  {
    MutexLock lock(releases_mu_);
    batch.swap(releases_);
  }
  for (const PendingRelease& r : batch) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end()) continue;  // removed since: its slots went with it
    Status released = it->second->pool->Release(r.slot, r.generation);
    if (!released.ok()) {
      log::Error("job {}: release of slot {} failed: {}", r.job_id, r.slot, released.ToString());
    }
  }
}

void Engine::CoordinatorLoop() {
  MutexLock lock(mu_);
  while (!stop_) {
    const auto begin = std::chrono::steady_clock::now();
    Step();
    coordinator_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (scheduler_->cut_short()) {
      // Rounds are still due: let the threads waiting for the lock (a removal, stats, a join's
      // next part) in, then go on at once.
      lock.Unlock();
      std::this_thread::yield();
      lock.Lock();
      continue;
    }
    mu_.WaitFor(wake_, options_.tick, [this]() REQUIRES(mu_) {
      return woken_ || stop_ || releases_pending_.load(std::memory_order_acquire);
    });
    woken_ = false;
  }
}

void Engine::Step() {
  ApplyReleases();
  const double now = Now();
  if (options_.cache_bytes > 0) {
    UpdateCapacity();
    scheduler_->SetSpareCpu(host_cpu_.Sample(now));
  }
  for (auto& [id, job] : jobs_) {
    if (job->source != nullptr) job->source->NoteClient(now);
  }
  // A data-parallel group waits on its clients when every rank's slots are full: a single job
  // sharing its samples is then lifted past it like past any slow job.
  for (auto& [key, group] : groups_) group->NoteClient(now);
  std::vector<Assignment> decided;
  // A slice at a time: a job joining decides its prefetch depth (thousands of rounds) over
  // several steps, so nobody waits for the lock for all of it.
  scheduler_->Tick(now, &decided, std::chrono::steady_clock::now() + kDecideSlice);
  if (options_.cache_bytes > 0) {
    // One cache lookup per decided sample: a hit when it is still cached from an earlier use.
    for (const Assignment& a : decided) {
      const SampleState state = samples_.states().Get(a.sample);
      if (state == SampleState::kPreparing || state == SampleState::kBad) continue;
      Check(cache_->Lookup(a.sample) ? samples_.states().LookupHit(a.sample)
                                     : samples_.states().LookupMiss(a.sample));
    }
  }
  FeedPreparation();
  const double join_timeout = std::chrono::duration<double>(options_.rank_join_timeout).count();
  for (auto& [key, group] : groups_) group->CheckJoined(now, join_timeout);
  samples_.Sweep(Now());
  for (auto& [id, job] : jobs_) {
    if (job->removed || job->done || job->assembling) continue;
    if (job->nothing_left) {
      job->done = true;
      job->sink->DeliverEndOfData(job->request.epochs);
      continue;
    }
    TryBuildBatch(*job);
    FinishIfDone(*job);
  }
}

void Engine::UpdateCapacity() {
  const cache::IndexStats c = cache_->Stats().index;
  if (c.entries == 0) return;
  // Samples that fit: the capacity over the mean slot; once the cache has been full, no more
  // than it ever held (slot classes and pages round sizes up).
  uint64_t samples = c.capacity_bytes / std::max<uint64_t>(1, c.bytes_used / c.entries);
  most_entries_ = std::max(most_entries_, c.entries);
  if (c.evictions > 0) samples = std::min(samples, most_entries_);
  // GPU decode: the cache holds encoded samples, but a decode is shared only while its pixels
  // stay in the GPU's resident area, which may hold fewer: pace by the smaller.
  for (const auto& gpu : gpus_) {
    if (const uint64_t held = gpu->DecodedSamplesHeld(); held > 0) {
      samples = std::min(samples, held);
    }
  }
  scheduler_->SetCapacity(samples);
}

void Engine::Check(const Status& transition) const {
  if (!transition.ok()) log::Error("sample state: {}", transition.ToString());
}

void Engine::FeedPreparation() {
  if (options_.cache_bytes == 0) return;  // every delivery is prepared by its assembler
  const size_t cap = 2 * workers_->size();
  if (prep_outstanding_ >= cap) return;
  size_t horizon = SIZE_MAX;
  size_t want = cap - prep_outstanding_;
  // The capacity counts slots as the allocator rounds them (UpdateCapacity), not payload bytes:
  // at 196,608-byte samples a slot takes 262,144, and a horizon from the payload overfilled the
  // cache by a third.
  if (const uint64_t capacity = scheduler_->capacity(); capacity > 0) {
    const cache::SampleCache::Occupancy held = cache_->Occupied();
    // Prepare ahead only into room that holds no decided sample: past that the cache would evict
    // samples that jobs have decided (the laggers' owed ones first) to hold samples needed later.
    // A batch at a job's front is prepared whatever this budget (TryBuildBatch).
    const uint64_t decided = held.decided + prep_outstanding_;
    want = std::min<size_t>(want, decided < capacity ? capacity - decided : 0);
    if (want == 0) return;
    // A replayed Ray Tune sweep at a 10% cache shared 1.78 with the whole cache as the horizon and
    // 1.90 with the prefetch depths (docs/benchmarks.md, "Issue 24, session 46").
    horizon = scheduler_->PrepareAheadHorizon(held.entries + prep_outstanding_);
  }
  std::vector<SampleId> next;
  // Ready samples stay ready while queued, except those that fall back to queued (a failed
  // commit, a lookup miss of a sample another job decided again, an eviction of an owed sample);
  // those are prepared when their batch reaches the front (TryBuildBatch), by the workers in
  // parallel, so the walk may skip known-ready prefixes.
  scheduler_->NextToPrepare(
      want, [this](SampleId s) REQUIRES(mu_) { return !samples_.states().NeedsPreparation(s); }, &next,
      horizon,
      /*ready_persists=*/true);
  for (SampleId s : next) StartPreparation(s);
}

void Engine::StartPreparation(uint32_t sample) {
  std::shared_ptr<const SampleSource> source = samples_.Source(sample);
  if (source == nullptr) return;  // cannot happen: every job's samples are in the table
  if (Status begun = samples_.states().BeginPreparation(sample); !begun.ok()) return Check(begun);
  ++prep_outstanding_;
  workers_->Post(WorkerPool::Queue::kFifo,
                 [this, sample, source = std::move(source)] { Prepare(sample, source); });
}

void Engine::TryBuildBatch(Job& job) {
  if (job.builds >= Job::kMaxBuilds) return;
  if (job.pool->FreeCount() == 0) return;  // no credit
  if (job.source == nullptr) return;  // a rank whose group is not complete
  std::vector<Decision> decisions;
  const BatchSource::Front front = job.source->Next(&decisions, Now());
  if (front == BatchSource::Front::kDropped) {  // a partial last batch (drop_last)
    job.front_prepared = 0;
    job.front_scanned = false;
  }
  if (front != BatchSource::Front::kBatch) return;
  if (decisions.front().epoch != job.epoch) {
    job.epoch = decisions.front().epoch;
    job.next_batch = 0;
  }
  const bool use_cache = options_.cache_bytes > 0;
  // Coupled pacing: a leader waits while the samples it would take first would outgrow what the
  // cache can hold for its laggers (docs/scheduler.md "Pacing").
  if (use_cache && !job.source->MayTake(decisions.size(), pins_, Now())) return;
  if (use_cache && !FrontBatchPrepared(job, decisions)) return;
  // A sample whose preparation threw (not a data error) fails the jobs that need it.
  for (const Decision& d : decisions) {
    if (const std::string* fault = samples_.states().Fault(d.sample)) {
      return FailJob(job, Status::Internal(*fault));
    }
  }
  BatchTask task;
  task.job = &job;
  task.epoch = job.epoch;
  task.decisions = decisions.size();
  bool ready = true;
  for (const Decision& d : decisions) {
    const SampleState state = samples_.states().Get(d.sample);
    if (state == SampleState::kBad) {
      ++task.skipped;
      continue;
    }
    BatchItem item;
    item.sample = d.sample;
    item.label = samples_.Label(d.sample);
    item.seed = SampleSeed(job.request.seed, d.epoch, d.sample);
    if (use_cache) {
      if (state == SampleState::kPreparing) {
        ready = false;
        continue;
      }
      if (state == SampleState::kCached) {
        if (!ready) continue;  // the batch waits anyway: pin nothing more
        const PreparedShape* shape = samples_.states().Shape(d.sample);
        if (shape != nullptr && cache_->Pin(d.sample).ok()) {
          item.pinned = true;
          item.shape = *shape;
          ++pins_;
        } else {
          // Evicted since it was prepared: its assembler prepares it again, transiently, rather
          // than the workers (with a cache smaller than a batch they could evict it again).
          Check(samples_.states().Evicted(d.sample));
        }
      } else if (state != SampleState::kTransient) {
        // Not prepared yet. The batch at the front needs it now, whatever the EDF horizon.
        StartPreparation(d.sample);
        ready = false;
        continue;
      }
    }
    // Only a sample the assembler prepares itself needs its source (built from its block).
    if (!item.pinned) item.source = samples_.Source(d.sample);
    task.items.push_back(std::move(item));
  }
  // Only this thread acquires slots, so FreeCount() > 0 above means TryAcquire succeeds.
  std::optional<WritableSlot> slot = ready ? job.pool->TryAcquire() : std::nullopt;
  if (!slot) {
    for (const BatchItem& item : task.items) {
      if (!item.pinned) continue;
      (void)cache_->Unpin(item.sample);
      --pins_;
    }
    return;
  }
  for (const BatchItem& item : task.items) {
    if (!use_cache) break;
    if (item.pinned) {
      samples_.states().Taken(item.sample);  // an eviction may requeue it again
    } else {
      Check(samples_.states().TakeTransient(item.sample));
    }
  }
  task.slot = *slot;
  task.batch_index = job.next_batch++;
  job.front_prepared = 0;  // the next batch is the front now
  job.front_scanned = false;
  job.source->Taken(decisions.size());
  job.assembling = true;
  ++job.builds;
  task.order = job.builds_taken++;
  task.overlaps = job.builds > 1;
  // Samples-fair: a batch starts where the job's last one ended or at the clock, whichever is
  // later, so jobs take the workers' turns in proportion to samples, not batches (a job of batch
  // 16 waited behind 60 others' batches of up to 512 and got a third of its fair share).
  task.fair_tag = std::max(fair_clock_, job.fair_finish);
  job.fair_finish = task.fair_tag + std::max<uint64_t>(1, task.decisions);
  const uint64_t tag = task.fair_tag;
  workers_->Post(
      WorkerPool::Queue::kOrdered,
      [this, t = std::move(task)]() mutable { Assemble(std::move(t)); }, tag);
}

bool Engine::FrontBatchPrepared(Job& job, const std::vector<Decision>& decisions) {
  // Called at every coordinator pass (one per preparation finished): resuming the scan keeps a
  // pass O(samples prepared since the last one) instead of O(batch size).
  bool prepared = true;
  for (size_t i = job.front_prepared; i < decisions.size(); ++i) {
    const SampleState state = samples_.states().Get(decisions[i].sample);
    if (state == SampleState::kQueued) StartPreparation(decisions[i].sample);
    if (state != SampleState::kQueued && state != SampleState::kPreparing) continue;
    if (prepared) job.front_prepared = i;
    prepared = false;
    // The first scan started every preparation the batch needs; later ones stop at the first
    // sample still being prepared (one that fell back to queued is started when reached).
    if (job.front_scanned) break;
  }
  job.front_scanned = true;
  if (prepared) job.front_prepared = decisions.size();
  return prepared;
}

void Engine::FinishIfDone(Job& job) {
  if (job.source != nullptr) job.source->FinishIfDone();
}

void Engine::FailJob(Job& job, const Status& why) {
  if (job.source == nullptr) return;  // nothing of it is served yet
  job.source->Fail(why);
  job.front_prepared = 0;
  job.front_scanned = false;
  job.sink->DeliverError(why);
}

void Engine::MarkBad(uint32_t sample, const SampleSource& source, const Status& status) {
  if (samples_.states().MarkBad(sample, status.ToString())) {
    log::Warn("sample {} (\"{}\"{}, prepared as \"{}\") is skipped: {}", source.record.id,
              source.record.path,
              source.record.record_index >= 0
                  ? fmt::format(", record {}", source.record.record_index)
                  : std::string(),
              source.spec.ToString(),
              status.ToString());
  }
}

}  // namespace carpool
