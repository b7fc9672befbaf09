// The engine's job admission: a job's creation (dataset, transform, checkpoint, data-parallel
// group, batch slots, sampling tree), its removal, and the devices it may ask for.
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/log.h"
#include "protocol/id_set.h"
#include "server/engine.h"
#include "server/engine_job.h"

namespace carpool {
namespace {

// Between two parts of a large table change, lets the threads waiting on the engine lock take it:
// a mutex is not fair, and re-locking at once kept the coordinator out for the whole loop (a
// 1.28M-sample join stalled another job's batches 80 ms idle, 285 ms in a loaded CI run). The
// unlock has woken a waiter; this gives it the time to run. 200 us x 79 parts: 16 ms a join.
void HandOverLock() { std::this_thread::sleep_for(std::chrono::microseconds(200)); }

}  // namespace

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

  // A GPU job's JPEGs are decoded on its GPU where that GPU decodes: its samples are the
  // decode=gpu prepared samples of the files, keyed apart from the CPU's (docs/gpu.md).
  if (const GpuService* gpu = ServedGpu(*device); gpu != nullptr && !gpu->decoder().empty() &&
                                                   !dataset->spec().raw &&
                                                   dataset->spec().channels == 3) {
    dataset->block->spec.gpu_decode = true;
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
  job->prepare = dataset->spec();
  // Into the sample table in parts, each its own short hold of the lock: 1.28M samples in one
  // hold stalled the other jobs' batches for over a second on a loaded machine.
  const size_t count = dataset->size();
  const double tabled_from = Now();
  for (size_t at = 0; at < count; at += kTableAddChunk) {
    Status added;
    {
      MutexLock lock(mu_);
      if (at == 0) samples_.Reserve(count);  // one rehash, while the table is small
      added = samples_.Acquire(*dataset, at, std::min(count, at + kTableAddChunk));
    }
    HandOverLock();
    if (!added.ok()) {
      ReleaseTable(SampleTable::KeysOf(*dataset, at));  // the parts before
      return added;
    }
  }
  const double tabled = Now() - tabled_from;
  {
    MutexLock lock(mu_);
    job->table_ids = std::move(table_ids);
    job->id = next_job_id_++;
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
    if (request.decode_in_job && options_.job_decode && job->prepare.gpu_decode &&
        !job->gpu->decoder().empty() && job->sink->job_decoder() != nullptr) {
      job->decoder = job->sink->job_decoder();
      info.decode_in_job = true;
    }
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
      joined = JoinGroup(*job, keys, agreed_batches);
    } else if (!job->nothing_left) {
      // A single job is its own participant of the sampling tree, with its own id.
      joined = scheduler_->AddJob(job->id, keys, request.epochs, prefetch_samples, job->created,
                                  {resume->epoch, request.resuming() ? &resume->remaining : nullptr});
      if (joined.ok()) job->source = std::make_unique<SingleJobSource>(*scheduler_, *job, job->id);
      // Without a cache nothing is prepared ahead of a batch: keep the whole prefetch decided.
      if (joined.ok() && options_.cache_bytes > 0) {
        scheduler_->SetBatch(job->id, request.batch_size);
        // The jobs already running give back what they decided ahead, alone, so that it is
        // decided again with this one (docs/scheduler.md "Joining"); each keeps its front batch,
        // or the batches it is building where two overlap (GPU decode in the job's process).
        std::unordered_map<JobId, uint64_t> front;  // single jobs; data-parallel groups keep all
        for (const auto& [id, other] : jobs_) {
          if (other->request.world_size <= 1 && other->request.nodes <= 1) {
            front[static_cast<JobId>(id)] =
                uint64_t{other->request.batch_size} * std::max<uint32_t>(1, other->builds);
          }
        }
        const uint64_t returned = scheduler_->UndecideTails(job->id, [&front](JobId id) {
          auto it = front.find(id);
          return it != front.end() ? it->second : UINT64_MAX;
        });
        if (returned > 0) {
          log::Info("job {}: the running jobs gave back {} decisions to decide them with it",
                    job->id, returned);
        }
      }
    }
    if (!joined.ok()) return joined;  // give_back, after this lock
    log::Info("job {}: dataset \"{}\" ({} samples), batch {}, {} epoch(s), transform \"{}\", {}, "
              "joined in {:.3f} s (records {:.3f} s, sample table {:.3f} s, engine lock "
              "{:.3f} s){}",
              job->id, request.dataset, job->dataset_size, request.batch_size, request.epochs,
              transform->ToString(), job->gpu ? fmt::format("cuda:{}", *device) : "cpu",
              Now() - began, loaded - began, tabled, Now() - locked,
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

Status Engine::JoinGroup(Job& job, const Roaring& ids, uint64_t batches_per_epoch) {
  const std::string& key = job.request.job_key;
  auto it = groups_.find(key);
  if (it == groups_.end()) {
    auto group = std::make_unique<DataParallelGroup>(*scheduler_, job, batches_per_epoch, Now());
    it = groups_.emplace(key, std::move(group)).first;
  }
  DataParallelGroup& group = *it->second;
  if (Status joined = group.Join(job); !joined.ok()) return joined;
  if (!group.complete()) return Status::OK();
  // Every rank is here: the job enters the sampling tree as one participant.
  return group.Start(job, next_job_id_++, ids, options_.cache_bytes > 0, Now());
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
    mu_.Wait(assembled_, [&j] { return j.builds == 0; });
    // The last rank of a data-parallel job to leave takes its group with it.
    if (j.source != nullptr && j.source->Leave()) groups_.erase(j.request.job_key);
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
  if (job->decoder != nullptr) job->gpu->ForgetJobDecoder(job->decoder);  // no build of it is left
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
    HandOverLock();
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

}  // namespace carpool
