#include "server/engine.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>

#include <opencv2/core.hpp>

#include "common/log.h"
#include "protocol/id_set.h"
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
  e->scheduler_ = std::make_unique<Scheduler>(so, &e->refs_);
  cache::CacheOptions co;
  co.instance = options.instance;
  co.capacity_bytes = options.cache_bytes;
  co.policy = options.policy;
  Result<std::unique_ptr<cache::SampleCache>> cache = cache::SampleCache::Create(
      co, options.policy == cache::EvictionPolicy::kNextUse ? e->scheduler_.get() : nullptr);
  if (!cache.ok()) return cache.status();
  e->cache_ = std::move(*cache);
  e->refs_.cache = e->cache_.get();
  GpuServiceOptions go;
  go.devices = options.gpus;
  go.resident_bytes = options.gpu_cache_bytes;
  go.host_region = e->cache_->Mapping();
  go.next_use = [raw = e.get()](std::span<const uint32_t> samples, std::span<double> out) {
    MutexLock lock(raw->mu_);
    for (size_t i = 0; i < samples.size(); ++i) out[i] = raw->scheduler_->NextUse(samples[i]);
  };
  Result<std::vector<std::unique_ptr<GpuService>>> gpus = CreateGpuServices(go);
  if (!gpus.ok()) return gpus.status();
  e->gpus_ = std::move(*gpus);
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

Result<protocol::JobInfo> Engine::CreateJob(const protocol::CreateJob& request,
                                            std::shared_ptr<JobSink> sink) {
  Result<int> device = ParseDevice(request.device);
  if (!device.ok()) return device.status();
  Result<TransformSpec> transform = ParseTransformSpec(request.transform);
  if (!transform.ok()) {
    return Status::InvalidArgument(
        fmt::format("bad transform \"{}\": {}", request.transform, transform.status().message()));
  }
  const bool ranked = request.world_size > 1 || request.nodes > 1;
  const uint64_t global_batch = uint64_t{request.batch_size} * std::max(1u, request.world_size);
  if (options_.lookahead > 0 && global_batch > options_.lookahead) {
    return Status::InvalidArgument(fmt::format(
        "{} {} exceeds the server's look-ahead of {} samples; use a smaller batch or restart the "
        "server with --lookahead {} or more",
        ranked ? fmt::format("the global batch ({} ranks x {})", request.world_size,
                             request.batch_size)
               : fmt::format("batch size {}", request.batch_size),
        global_batch, options_.lookahead, global_batch));
  }
  const double began = Now();
  Result<DatasetSamples> dataset = Status::Internal("not loaded");
  {
    MutexLock lock(catalog_mu_);
    dataset = LoadDatasetSamples(*catalog_, request.dataset, reader_);
  }
  if (!dataset.ok()) return dataset.status();
  const double loaded = Now();
  Result<ImageShape> image = TransformedShape(*transform, dataset->prepared_shape);
  if (!image.ok()) {
    const PreparedShape& p = dataset->prepared_shape;
    return Status::InvalidArgument(fmt::format(
        "transform \"{}\" cannot be applied to dataset \"{}\" (prepared samples are {}x{}x{}): {}",
        request.transform, request.dataset, p.height, p.width, p.channels,
        image.status().message()));
  }

  // Its samples are keyed under its prepare spec: another spec of the same files is another
  // prepared sample (server/prepared_keys.h).
  uint32_t key_base = 0;
  {
    MutexLock lock(mu_);
    Result<uint32_t> base =
        keys_.BaseFor(dataset->spec(), dataset->info.ids.maximum(), request.dataset);
    if (!base.ok()) return base.status();
    key_base = *base;
  }
  dataset->block->key_base = key_base;
  // The whole dataset: the table holds all its samples.
  Roaring table_ids = KeysOf(dataset->info.ids, key_base);
  // A job spanning several nodes gets this node's part; every node agrees on the batch count.
  uint64_t agreed_batches = 0;
  if (ranked) {
    const std::vector<uint64_t> parts =
        NodePartSizes(dataset->info.ids, options_.partition_seed, request.nodes);
    agreed_batches = AgreedBatchesPerEpoch(parts, global_batch, request.drop_last);
    if (request.nodes > 1) {
      dataset->info.ids =
          NodePart(dataset->info.ids, options_.partition_seed, request.node, request.nodes);
    }
    if (dataset->info.ids.isEmpty()) {
      return Status::InvalidArgument(fmt::format(
          "dataset \"{}\" has no samples for node {} of {} (its {} samples split over {} nodes); "
          "use fewer nodes for so small a dataset",
          request.dataset, request.node, request.nodes,
          std::accumulate(parts.begin(), parts.end(), uint64_t{0}), request.nodes));
    }
    if (agreed_batches == 0) {
      return Status::InvalidArgument(fmt::format(
          "dataset \"{}\" gives node {} of {} only {} samples, less than one global batch of {} "
          "with drop_last; use a smaller batch, fewer ranks or drop_last off",
          request.dataset, request.node, request.nodes, dataset->info.ids.cardinality(),
          global_batch));
    }
  }
  // A job resumed from a checkpoint: the rest of its epoch, then its remaining epochs.
  Result<ResumePoint> resume = ResumeFrom(request, dataset->info.ids, ranked);
  if (!resume.ok()) return resume.status();
  // From here on the scheduler sees keys; only batches carry catalog ids again.
  const Roaring keys = KeysOf(dataset->info.ids, key_base);
  resume->remaining = KeysOf(resume->remaining, key_base);
  auto job = std::make_unique<Job>();
  job->request = request;
  job->epoch = resume->epoch;
  job->next_batch = resume->batch;
  job->nothing_left = resume->nothing_left;
  job->dataset_size = dataset->info.ids.cardinality();
  job->transform = *transform;
  job->image = *image;
  job->sink = std::move(sink);
  job->gpu = ServedGpu(*device);
  job->key_base = key_base;
  job->prepare_spec = dataset->spec().ToString();
  // Into the sample table in parts, each its own short hold of the lock: 1.28M samples in one
  // hold stalled the other jobs' batches for over a second on a loaded machine.
  const size_t count = dataset->size();
  for (size_t at = 0; at < count; at += kTableAddChunk) {
    Status added;
    {
      MutexLock lock(mu_);
      added = samples_.Acquire(*dataset, at, std::min(count, at + kTableAddChunk));
    }
    if (!added.ok()) {
      ReleaseTable(SampleTable::KeysOf(*dataset, at));  // the parts before
      return added;
    }
  }
  {
    MutexLock lock(mu_);
    job->table_ids = std::move(table_ids);
    job->sched = next_job_id_++;
    job->id = job->sched;
  }
  // Until the job is in jobs_, a failure gives its samples back to the table.
  bool committed = false;
  struct OnExit {
    std::function<void()> fn;
    ~OnExit() { fn(); }
  } give_back{[&] {
    if (!committed) ReleaseTable(job->table_ids);
  }};
  // A GPU job's host slot holds only labels and ids; its images go to its device slot.
  const slots::BatchLayout full =
      slots::PlanBatchLayout(request.batch_size, job->gpu ? 0 : image->bytes());
  if (job->gpu != nullptr) {
    Result<std::unique_ptr<DeviceSlots>> device_slots =
        job->gpu->CreateSlots(request.prefetch, request.batch_size, image->bytes());
    if (!device_slots.ok()) return device_slots.status();
    job->device_slots = std::move(*device_slots);
  }
  Result<std::unique_ptr<BatchPool>> pool =
      BatchPool::Create(BatchPool::SegmentName(options_.instance, job->id), job->id,
                        request.prefetch, full.total_bytes);
  if (!pool.ok()) return pool.status();
  job->pool = std::move(*pool);

  protocol::JobInfo info;
  info.job_id = job->id;
  info.dataset_size = job->dataset_size;
  info.batch_size = request.batch_size;
  info.epochs = request.epochs;
  // A rank gets one batch per global batch: every rank the same number.
  info.batches_per_epoch = ranked ? agreed_batches
                         : request.drop_last
                             ? job->dataset_size / global_batch
                             : (job->dataset_size + global_batch - 1) / global_batch;
  if (image->layout == Layout::kNCHW) {
    info.sample_shape = {static_cast<uint32_t>(image->channels),
                         static_cast<uint32_t>(image->height), static_cast<uint32_t>(image->width)};
  } else {
    info.sample_shape = {static_cast<uint32_t>(image->height), static_cast<uint32_t>(image->width),
                         static_cast<uint32_t>(image->channels)};
  }
  info.dtype = image->dtype;
  info.layout = image->layout;
  info.start_epoch = resume->epoch;
  info.start_batch = resume->batch;
  info.segment_name = job->pool->name();
  info.slot_count = job->pool->slot_count();
  info.slot_bytes = job->pool->slot_bytes();
  if (job->device_slots) {
    info.device = job->device_slots->device();
    info.device_handle = job->device_slots->ipc_handle();
    info.device_pci_bus_id = job->device_slots->pci_bus_id();
    info.device_slot_stride = job->device_slots->stride();
    info.device_slot_bytes = job->device_slots->slot_bytes();
    info.device_offset = job->device_slots->ipc_offset();
  }

  {
    MutexLock lock(mu_);
    // Ask for the batches the credits allow, and one more, to be decided ahead.
    const uint64_t prefetch_samples =
        uint64_t{request.prefetch + 1} * request.batch_size;  // the scheduler clamps it to L
    job->created = Now();
    const double locked = job->created;
    Status joined;
    if (ranked) {
      job->sched = 0;  // the group's, once every rank has joined
      joined = JoinGroup(*job, keys, agreed_batches);
    } else if (!job->nothing_left) {
      joined = scheduler_->AddJob(job->sched, keys, request.epochs, prefetch_samples,
                                  job->created,
                                  {resume->epoch, request.resuming() ? &resume->remaining : nullptr});
      // Without a cache nothing is prepared ahead of a batch: keep the whole prefetch decided.
      if (joined.ok() && options_.cache_bytes > 0) {
        scheduler_->SetBatch(job->sched, request.batch_size);
      }
    }
    if (!joined.ok()) return joined;  // give_back, after this lock
    log::Info("job {}: dataset \"{}\" ({} samples), batch {}, {} epoch(s), transform \"{}\", {}, "
              "joined in {:.3f} s (records {:.3f} s, engine lock {:.3f} s){}",
              job->id, request.dataset, job->dataset_size, request.batch_size, request.epochs,
              transform->ToString(), job->gpu ? fmt::format("cuda:{}", *device) : "cpu",
              Now() - began, loaded - began, Now() - locked,
              ranked ? fmt::format(", rank {} of {} of job \"{}\" (node {} of {})", request.rank,
                                   request.world_size, request.job_key, request.node,
                                   request.nodes)
                     : std::string());
    jobs_[job->id] = std::move(job);
    committed = true;
    ++jobs_created_;
    woken_ = true;
  }
  wake_.notify_one();
  return info;
}

Result<Engine::ResumePoint> Engine::ResumeFrom(const protocol::CreateJob& request,
                                               const Roaring& ids, bool ranked) {
  ResumePoint point;
  if (!request.resuming()) return point;  // `remaining` unused: the whole dataset
  if (ranked) {
    return Status::InvalidArgument(fmt::format(
        "job \"{}\" has {} ranks on {} node(s): resuming a data-parallel job from a checkpoint is "
        "not supported yet; start it without the checkpoint's position (at an epoch's start)",
        request.job_key, request.world_size, request.nodes));
  }
  if (request.resume_epoch > request.epochs ||
      (request.resume_epoch == request.epochs && !request.resume_taken.empty())) {
    return Status::InvalidArgument(fmt::format(
        "the checkpoint is in epoch {} (0-based) but the job asks for {} epoch(s); ask for more "
        "epochs or start without the checkpoint",
        request.resume_epoch, request.epochs));
  }
  Roaring taken;
  if (!request.resume_taken.empty()) {
    Result<std::vector<uint32_t>> decoded = protocol::DecodeIdSet(request.resume_taken, ids.cardinality());
    if (!decoded.ok()) {
      return Status::InvalidArgument(fmt::format("the checkpoint's samples taken: {}",
                                                 decoded.status().message()));
    }
    taken.addMany(decoded->size(), decoded->data());
  }
  const Roaring outside = taken - ids;
  if (!outside.isEmpty()) {
    return Status::InvalidArgument(fmt::format(
        "the checkpoint took {} sample(s) that dataset \"{}\" does not hold (such as id {}): it "
        "comes from another dataset, or the dataset was registered again; start without it",
        outside.cardinality(), request.dataset, outside.minimum()));
  }
  point.epoch = request.resume_epoch;
  point.batch = request.resume_batches;
  point.remaining = ids - taken;
  if (point.remaining.isEmpty()) {  // taken after the epoch's last batch: the next one
    ++point.epoch;
    point.batch = 0;
    point.remaining = ids;
  }
  point.nothing_left = point.epoch >= request.epochs;
  if (point.nothing_left) point.epoch = request.epochs;
  return point;
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

void Engine::RemoveJob(uint64_t job_id) {
  std::unique_ptr<Job> job;
  Roaring table_ids;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second->removed) return;
    Job& j = *it->second;
    j.removed = true;
    // The batch in flight, if any, still calls the sink; wait for it (milliseconds).
    mu_.Wait(assembled_, [&j] { return !j.assembling; });
    if (j.group != nullptr) {
      LeaveGroup(j);
    } else if (scheduler_->Contains(j.sched)) {
      Status removed = scheduler_->RemoveJob(j.sched);
      if (!removed.ok()) log::Error("job {}: {}", job_id, removed.ToString());
    }
    j.pool->Shutdown();
    j.pool->ReleaseAll();
    table_ids = std::move(j.table_ids);
  }
  // Its samples go back in parts; the job stays in jobs_ (removed, served by nobody) meanwhile,
  // so that `status` counts it until all it held is back.
  const size_t released = ReleaseTable(table_ids);
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(job_id);
    Job& j = *it->second;
    log::Info("job {} removed: {} samples delivered in {} batches, {} skipped", job_id,
              j.deliveries, j.batches, j.skipped);
    job = std::move(it->second);
    jobs_.erase(it);
    ++jobs_removed_;
    woken_ = true;
  }
  wake_.notify_one();
  job.reset();  // unlinks the batch segment outside the lock
#ifdef __GLIBC__
  // A dataset's last job left: give its per-sample state's freed pages back to the system (glibc
  // keeps freed heap otherwise). Milliseconds, outside the lock.
  if (released >= kTrimAfterSamples) malloc_trim(0);
#endif
}

size_t Engine::ReleaseTable(const Roaring& keys) {
  size_t released = 0;
  std::vector<uint32_t> part;
  part.reserve(std::min<uint64_t>(keys.cardinality(), kTableAddChunk));
  auto flush = [&] {
    MutexLock lock(mu_);
    const ReleasedSamples r = samples_.Release(part);
    released += r.samples.size();
    for (const std::string& path : r.idx_paths) reader_.Forget(path);
    part.clear();
  };
  for (uint32_t key : keys) {
    part.push_back(key);
    if (part.size() == kTableAddChunk) flush();
  }
  if (!part.empty()) flush();
  return released;
}

GpuService* Engine::ServedGpu(int device) const {
  for (const auto& gpu : gpus_) {
    if (gpu->device() == device) return gpu.get();
  }
  return nullptr;
}

Result<int> Engine::ParseDevice(const std::string& device) const {
  if (device == "cpu") return -1;
  std::string served;
  for (const auto& gpu : gpus_) {
    served += fmt::format("{}cuda:{}", served.empty() ? "" : ", ", gpu->device());
  }
  const std::string hint =
      served.empty() ? std::string("this server serves no GPU (start it with --gpus 0 or --gpus "
                                   "all on a machine with GPUs), so use device \"cpu\"")
                     : fmt::format("this server serves {}; use one of those or \"cpu\"", served);
  int index = -1;
  if (device == "cuda") {
    index = 0;
  } else if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 9 &&
             device.find_first_not_of("0123456789", 5) == std::string::npos) {
    index = std::stoi(device.substr(5));
  } else {
    return Status::InvalidArgument(
        fmt::format("device \"{}\" is not \"cpu\" or \"cuda:N\"; {}", device, hint));
  }
  if (ServedGpu(index) == nullptr) {
    return Status::InvalidArgument(
        fmt::format("device \"{}\" is not served by this server: {}", device, hint));
  }
  return index;
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
  if (options_.cache_bytes > 0) UpdateCapacity();
  for (auto& [id, job] : jobs_) {
    if (job->group == nullptr && !job->removed && !job->done) {
      scheduler_->NoteClientBound(job->sched, job->pool->FreeCount() == 0, now);
    }
  }
  // A data-parallel group waits on its clients when every rank's slots are full: a single job
  // sharing its samples is then lifted past it like past any slow job.
  for (auto& [key, group] : groups_) {
    if (group->sched == 0 || group->failed) continue;
    bool bound = true;
    for (const Job* rank : group->ranks) {
      if (rank == nullptr || rank->pool->FreeCount() != 0) bound = false;
    }
    scheduler_->NoteClientBound(group->sched, bound, now);
  }
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
  if (!groups_.empty()) CheckGroups();
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
  scheduler_->SetCapacity(samples);
}

void Engine::Check(const Status& transition) const {
  if (!transition.ok()) log::Error("sample state: {}", transition.ToString());
}

void Engine::FeedPreparation() {
  if (options_.cache_bytes == 0) return;  // every delivery is prepared by its assembler
  const size_t cap = 2 * workers_->size();
  if (prep_outstanding_ >= cap) return;
  // Look no further ahead than the cache holds: what is prepared beyond that would be evicted
  // before its use (estimated from the bytes of the samples prepared so far).
  // The capacity counts slots as the allocator rounds them (UpdateCapacity), not payload bytes:
  // at 196,608-byte samples a slot takes 262,144, and a horizon from the payload overfilled the
  // cache by a third.
  size_t horizon = SIZE_MAX;
  if (const uint64_t capacity = scheduler_->capacity(); capacity > 0) {
    horizon = capacity;
  }
  // Prepare ahead only into room that holds no decided sample: past that the cache would evict
  // samples that jobs have decided (the laggers' owed ones first) to hold samples needed later.
  // A batch at a job's front is prepared whatever this budget (TryBuildBatch).
  size_t want = cap - prep_outstanding_;
  if (horizon != SIZE_MAX) {
    const uint64_t held = cache_->DecidedEntries() + prep_outstanding_;
    want = std::min<size_t>(want, held < horizon ? horizon - held : 0);
    if (want == 0) return;
  }
  std::vector<SampleId> next;
  // Ready samples stay ready while queued, except the rare ones that fall back to queued (a
  // failed commit, a lookup miss of a sample another job decided again); those are prepared
  // when their batch reaches the front (TryBuildBatch), so the walk may skip known-ready prefixes.
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
  workers_->Post(WorkerPool::Priority::kNormal,
                 [this, sample, source = std::move(source)] { Prepare(sample, source); });
}

void Engine::TryBuildBatch(Job& job) {
  if (job.pool->FreeCount() == 0) return;  // no credit
  std::vector<Decision> decisions;
  const uint32_t b = job.request.batch_size;
  if (job.group != nullptr) {
    if (!RankSlice(job, &decisions)) return;
  } else if (!scheduler_->NextBatch(job.sched, b, &decisions) || decisions.empty()) {
    return;
  }
  if (decisions.front().epoch != job.epoch) {
    job.epoch = decisions.front().epoch;
    job.next_batch = 0;
  }
  if (job.group == nullptr && decisions.size() < b && job.request.drop_last) {
    Status consumed = scheduler_->Consume(job.sched, decisions.size(), Now());
    if (!consumed.ok()) log::Error("job {}: {}", job.id, consumed.ToString());
    job.front_prepared = 0;
    job.front_scanned = false;
    job.dropped += decisions.size();
    job.consumed += decisions.size();
    return;
  }
  const bool use_cache = options_.cache_bytes > 0;
  // Coupled pacing: a leader waits while the samples it would take first would outgrow what the
  // cache can hold for its laggers (docs/scheduler.md "Pacing").
  if (use_cache && job.group == nullptr &&
      !scheduler_->MayTake(job.sched, decisions.size(), pins_, Now())) {
    return;
  }
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
    if (use_cache && !item.pinned) Check(samples_.states().TakeTransient(item.sample));
  }
  task.slot = *slot;
  task.batch_index = job.next_batch++;
  job.front_prepared = 0;  // the next batch is the front now
  job.front_scanned = false;
  if (job.group != nullptr) job.group->taken[job.rank] = true;
  job.assembling = true;
  // Samples-fair: a batch starts where the job's last one ended or at the clock, whichever is
  // later, so jobs take the workers' turns in proportion to samples, not batches (a job of batch
  // 16 waited behind 60 others' batches of up to 512 and got a third of its fair share).
  task.fair_tag = std::max(fair_clock_, job.fair_finish);
  job.fair_finish = task.fair_tag + std::max<uint64_t>(1, task.decisions);
  const uint64_t tag = task.fair_tag;
  workers_->Post(
      WorkerPool::Priority::kHigh,
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
  if (job.group != nullptr) {
    FinishRankIfDone(job);
    return;
  }
  if (job.assembling || job.done || !scheduler_->Contains(job.sched) ||
      !scheduler_->Finished(job.sched)) {
    return;
  }
  job.done = true;
  Status removed = scheduler_->RemoveJob(job.sched);
  if (!removed.ok()) log::Error("job {}: {}", job.id, removed.ToString());
  job.sink->DeliverEndOfData(job.request.epochs);
}

void Engine::FailJob(Job& job, const Status& why) {
  if (job.group != nullptr) {
    if (!job.group->failed) FailGroup(*job.group, why);
    return;
  }
  if (job.done) return;
  log::Warn("job {} fails: {}", job.id, why.ToString());
  job.done = true;
  if (scheduler_->Contains(job.sched)) {
    Status removed = scheduler_->RemoveJob(job.sched);
    if (!removed.ok()) log::Error("job {}: {}", job.id, removed.ToString());
  }
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
