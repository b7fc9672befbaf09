// The engine's worker tasks: preparing a sample into the cache, and assembling a job's batch.
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "carpool/log.h"
#include "server/assemble.h"
#include "server/engine.h"
#include "server/engine_job.h"
#include "server/gpu_service.h"

namespace carpool {

Engine::WorkerLock::WorkerLock(Engine& engine) : engine_(engine) {
  const auto begin = std::chrono::steady_clock::now();
  WorkerPhases::Scope phase(engine_.phases_, WorkerPhase::kLock);
  engine_.mu_.Lock();
  engine_.worker_lock_wait_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin)
          .count(),
      std::memory_order_relaxed);
}

Engine::WorkerLock::~WorkerLock() { engine_.mu_.Unlock(); }

void Engine::Prepare(uint32_t sample, std::shared_ptr<const SampleSource> source) {
  const SampleSource& src = *source;
  // Ends the task: `fn` updates the sample's state under the lock.
  auto finish = [&](auto&& fn) {
    {
      WorkerLock lock(*this);
      fn();
      --prep_outstanding_;
      ForgetIfUnused(sample);  // its last job left while it was being prepared
      // The read below may have loaded the IDX file again after that job's release freed it.
      if (src.record.source == "idx" && !samples_.Contains(sample) &&
          !samples_.ReadsIdx(src.record.path)) {
        reader_.Forget(src.record.path);
      }
      woken_ = true;
    }
    wake_.notify_one();
  };
  // Its last job left while it waited in the queue: reading would load its IDX file again.
  if (src.released()) {
    return finish([&]() REQUIRES(mu_) { Check(states_.Abandoned(sample)); });
  }
  Result<std::vector<uint8_t>> bytes = [&] {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kRead);
    return reader_.Read(src.record);
  }();
  Result<PreparedShape> shape = bytes.ok() ? PreparedShapeFor(src.spec, *bytes, src.raw_shape)
                                           : Result<PreparedShape>(bytes.status());
  if (!shape.ok()) return finish([&]() REQUIRES(mu_) { MarkBad(sample, src, shape.status()); });
  Result<cache::SampleCache::Allocation> slot = Status::Internal("not allocated");
  {
    WorkerLock lock(*this);  // Allocate may ask the scheduler for next uses
    WorkerPhases::Scope phase(phases_, WorkerPhase::kAllocate);
    std::vector<uint32_t> evicted;
    slot = cache_->Allocate(sample, shape->bytes(), &evicted);
    // A sample no job uses loses its state with its slot, not at the next orphan sweep.
    for (uint32_t gone : evicted) ForgetIfUnused(gone);
  }
  if (!slot.ok()) {
    const StatusCode code = slot.status().code();
    return finish([&]() REQUIRES(mu_) {
      if (code == StatusCode::kAlreadyExists) {
        if (Status cached = states_.AlreadyCached(sample); !cached.ok()) {
          Check(cached);
          Check(states_.NoRoom(sample));  // never left preparing: its assembler prepares it
        }
      } else {
        // No room (pinned samples fill the cache): its assembler prepares it instead.
        if (code != StatusCode::kResourceExhausted) log::Warn("{}", slot.status().ToString());
        Check(states_.NoRoom(sample));
      }
    });
  }
  Result<PreparedShape> written = [&] {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kDecode);
    return PrepareInto(src.spec, *bytes, slot->data, src.raw_shape);
  }();
  if (!written.ok()) {
    (void)cache_->Abort(sample);
    return finish([&]() REQUIRES(mu_) { MarkBad(sample, src, written.status()); });
  }
  Result<cache::SlotRef> committed = [&] {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kCommit);
    return cache_->Commit(sample);
  }();
  finish([&]() REQUIRES(mu_) {
    if (!committed.ok()) {
      log::Error("sample {}: {}", sample, committed.status().ToString());
      Check(states_.Abandoned(sample));
      return;
    }
    ++preparations_;
    Check(states_.Committed(sample, *written));
  });
}

Result<PreparedImage> Engine::PrepareTransient(const SampleSource& source) {
  Result<std::vector<uint8_t>> bytes = reader_.Read(source.record);
  if (!bytes.ok()) return bytes.status();
  return PrepareSample(source.spec, *bytes, source.raw_shape);
}

void Engine::Assemble(BatchTask task) {
  Job& job = *task.job;
  std::vector<PreparedImage> owned;
  owned.reserve(task.items.size());  // views point into it: no reallocation
  std::vector<PreparedView> views;
  std::vector<uint64_t> seeds;
  std::vector<int32_t> labels;
  std::vector<uint32_t> ids;
  std::vector<std::pair<uint32_t, Status>> unreadable;
  std::optional<Status> misfit;  // the first sample whose shape this job's transform cannot take
  uint32_t skipped = task.skipped;
  uint64_t transient = 0;
  for (const BatchItem& item : task.items) {
    PreparedView view;
    if (item.pinned) {
      Result<std::span<const uint8_t>> data = cache_->PinnedData(item.sample);
      if (!data.ok()) {  // cannot happen while pinned
        unreadable.emplace_back(item.sample, data.status());
        ++skipped;
        continue;
      }
      view = {data->data(), item.shape};
    } else {
      Result<PreparedImage> image = [&] {
        WorkerPhases::Scope phase(phases_, WorkerPhase::kTransient);
        return PrepareTransient(*item.source);
      }();
      if (!image.ok()) {
        unreadable.emplace_back(item.sample, image.status());
        ++skipped;
        continue;
      }
      ++transient;
      owned.push_back(std::move(*image));
      view = owned.back().view();
    }
    Result<ImageShape> shape = TransformedShape(job.transform, view.shape);
    if (!shape.ok() || !(*shape == job.image)) {
      // A property of this job's transform, not of the sample: skipped for this job only (other
      // jobs' transforms may fit it), so not marked bad.
      if (!misfit) {
        misfit = Status::InvalidArgument(fmt::format(
            "sample {} is prepared as {}x{}x{}, which the job's transform \"{}\" does not turn "
            "into its batch shape {}x{}x{}; add a crop to the dataset's prepare spec or the "
            "transform",
            item.sample, view.shape.height, view.shape.width, view.shape.channels,
            job.transform.ToString(), job.image.height, job.image.width, job.image.channels));
      }
      ++skipped;
      continue;
    }
    views.push_back(view);
    seeds.push_back(item.seed);
    labels.push_back(item.label);
    ids.push_back(item.sample);
  }

  // Every batch index of an epoch is published, even with no sample in it (all skipped, or the
  // assembly failed), so that the client sees each batch's skipped count and no index is missing.
  auto n = static_cast<uint32_t>(views.size());
  // A GPU job's host slot holds labels and ids only; its images go to its device slot.
  const uint64_t host_image_bytes = job.gpu ? 0 : job.image.bytes();
  if (n > 0) {
    const slots::BatchLayout full = slots::PlanBatchLayout(n, host_image_bytes);
    uint8_t* base = task.slot.data.data();
    Status assembled;
    if (job.gpu != nullptr) {
      DeviceBatchRequest request;
      request.spec = &job.transform;
      request.samples = views;
      request.sample_ids = ids;
      request.seeds = seeds;
      request.labels = labels;
      request.slots = job.device_slots.get();
      request.slot = task.slot.index;
      WorkerPhases::Scope phase(phases_, WorkerPhase::kGpuBuild);
      assembled = job.gpu->Build(request);
    } else {
      WorkerPhases::Scope phase(phases_, WorkerPhase::kAssemble);
      assembled = AssembleBatch(job.transform, views, seeds, base + full.images_offset,
                                full.images_bytes)
                      .status();
    }
    if (assembled.ok()) {
      std::memcpy(base + full.labels_offset, labels.data(), full.labels_bytes);
      std::memcpy(base + full.ids_offset, ids.data(), full.ids_bytes);
    } else {
      log::Error("job {}: batch {} of epoch {} not assembled, its {} samples are skipped: {}",
                 job.id, task.batch_index, task.epoch, n, assembled.ToString());
      skipped += n;
      n = 0;
    }
  }
  const slots::BatchLayout layout = slots::PlanBatchLayout(n, host_image_bytes);
  uint64_t unpinned = 0;
  for (const BatchItem& item : task.items) {
    if (!item.pinned) continue;
    (void)cache_->Unpin(item.sample);
    ++unpinned;
  }
  bool delivered = false;
  std::optional<WorkerPhases::Scope> delivering(std::in_place, phases_, WorkerPhase::kDeliver);
  Result<uint64_t> generation = job.pool->Publish(task.slot.index);
  if (generation.ok()) {
    protocol::BatchReady ready = MakeBatchReady(job.id, task.slot.index, *generation, task.epoch,
                                                task.batch_index, n, layout);
    ready.skipped = skipped;
    if (job.gpu != nullptr) {  // images and int64 labels in the device slot of the same index
      ready.on_device = true;
      ready.images_offset = 0;
      ready.images_bytes = uint64_t{n} * job.image.bytes();
      ready.device_labels_offset = job.device_slots->labels_offset();
    }
    job.sink->DeliverBatch(ready);
    delivered = true;
  } else {
    (void)job.pool->Abandon(task.slot.index);
    log::Error("job {}: batch {} of epoch {} not published, its {} samples are skipped: {}",
               job.id, task.batch_index, task.epoch, n, generation.status().ToString());
    skipped += n;  // consumed, never delivered
  }
  delivering.reset();

  {
    WorkerLock lock(*this);
    pins_ -= unpinned;
    for (const auto& [sample, status] : unreadable) {
      std::shared_ptr<const SampleSource> source = samples_.Find(sample);
      if (source) MarkBad(sample, *source, status);
    }
    if (misfit && !job.misfit_logged) {
      job.misfit_logged = true;
      log::Warn("job {}: samples are skipped for this job: {}", job.id, misfit->ToString());
    }
    transient_preparations_ += transient;
    if (job.group != nullptr) {
      SliceAssembled(job);  // the group consumes its global batch once every slice is built
    } else {
      Status consumed = scheduler_->Consume(job.sched, task.decisions, Now());
      if (!consumed.ok()) log::Error("job {}: {}", job.id, consumed.ToString());
    }
    job.consumed += task.decisions;
    job.skipped += skipped;
    skipped_ += skipped;
    if (delivered) {
      job.deliveries += n;
      deliveries_ += n;
      ++job.batches;
      ++batches_;
    }
    job.assembling = false;
    fair_clock_ = std::max(fair_clock_, task.fair_tag);
    woken_ = true;
  }
  assembled_.notify_all();
  wake_.notify_one();
}

}  // namespace carpool
