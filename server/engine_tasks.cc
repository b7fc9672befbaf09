// The engine's worker tasks: preparing a sample into the cache, and assembling a job's batch.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "common/elapsed.h"
#include "common/log.h"
#include "server/assemble.h"
#include "server/engine.h"
#include "server/engine_job.h"
#include "server/gpu_service.h"
#include "server/job_decode.h"

namespace carpool {

// A job's third build sends its JPEGs into the lane of its first, which the first build's
// assembly may still be reading: the engine starts it only after the first's Build returned,
// which waits for that GPU work (GpuService::Build). Hence no more builds than lanes.
static_assert(EngineJob::kMaxBuilds <= JobDecoder::kLanes,
              "a job's builds in flight must not outnumber its decode lanes");

Engine::WorkerLock::WorkerLock(Engine& engine) : engine_(engine) {
  const auto begin = std::chrono::steady_clock::now();
  WorkerPhases::Scope phase(engine_.phases_, WorkerPhase::kLock);
  engine_.mu_.Lock();
  engine_.worker_lock_wait_ns_.fetch_add(NanosSince(begin), std::memory_order_relaxed);
}

Engine::WorkerLock::~WorkerLock() { engine_.mu_.Unlock(); }

void Engine::Prepare(uint32_t sample, std::shared_ptr<const SampleSource> source) {
  PrepareProgress progress;
  try {
    PrepareInCache(sample, *source, progress);
  } catch (const std::exception& e) {
    PrepareFaulted(sample, *source, progress, e.what());
  } catch (...) {
    PrepareFaulted(sample, *source, progress, "an exception of unknown type");
  }
}

void Engine::PrepareFaulted(uint32_t sample, const SampleSource& src,
                            const PrepareProgress& progress, std::string_view what) {
  if (progress.finished) {  // thrown after the state was updated: nothing is held any more
    log::Error("sample {}: its preparation threw after it ended: {}", src.record.id, what);
    return;
  }
  if (progress.allocated) (void)cache_->Abort(sample);
  {
    WorkerLock lock(*this);
    const std::string reason = fmt::format(
        "preparing sample {} (\"{}\", prepared as \"{}\") failed inside the server: {}",
        src.record.id, src.record.path, src.spec.ToString(), what);
    if (samples_.states().MarkFaulted(sample, reason)) log::Error("{}", reason);
    --prep_outstanding_;
    Check(samples_.Settle(sample));  // a job coming back to it later tries again
    woken_ = true;
  }
  wake_.notify_one();
}

void Engine::PrepareInCache(uint32_t sample, const SampleSource& src, PrepareProgress& progress) {
  // Ends the task: `fn` updates the sample's state under the lock.
  auto finish = [&](auto&& fn) {
    {
      WorkerLock lock(*this);
      progress.finished = true;
      fn();
      --prep_outstanding_;
      Check(samples_.Settle(sample));  // its last job left while it was being prepared
      // The read below may have loaded the IDX file again after that job's release freed it.
      if (src.record.source == "idx" && !samples_.InUse(sample) &&
          !samples_.ReadsIdx(src.record.path)) {
        reader_.Forget(src.record.path);
      }
      woken_ = true;
    }
    wake_.notify_one();
  };
  // Its last job left while it waited in the queue: reading would load its IDX file again.
  if (src.released()) {
    return finish([&]() REQUIRES(mu_) { Check(samples_.states().Abandoned(sample)); });
  }
  FaultInjection::MaybeThrow(options_.faults.prepare, "preparation", src.record.id);
  Result<std::vector<uint8_t>> bytes = [&] {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kRead);
    return reader_.Read(src.record);
  }();
  Result<PreparedShape> shape = bytes.ok() ? PreparedShapeFor(src.spec, *bytes, src.raw_shape)
                                           : Result<PreparedShape>(bytes.status());
  if (!shape.ok()) return finish([&]() REQUIRES(mu_) { MarkBad(sample, src, shape.status()); });
  Result<cache::SampleCache::Allocation> slot = Status::Internal("not allocated");
  {
    // The cache needs no caller's lock (it ranks by next uses it holds and calls nobody back),
    // but the coordinator makes its cache calls under the engine's lock: an Allocate outside it
    // made the coordinator wait on the cache's mutex while holding the engine's, and `carpool
    // bench load` (16 jobs, 10% cache) fell from 66k to 54k samples/s (docs/architecture.md).
    WorkerLock lock(*this);
    WorkerPhases::Scope phase(phases_, WorkerPhase::kAllocate);
    std::vector<uint32_t> evicted;
    slot = cache_->Allocate(sample, shape->stored_bytes(), &evicted);
    progress.allocated = slot.ok();
    // Told now, under the lock the eviction happened under: a sample a job still needs goes back
    // to the workers; one no job uses loses its state with its slot, not at the next orphan sweep.
    for (uint32_t gone : evicted) Check(samples_.Evicted(gone));
  }
  if (!slot.ok()) {
    const StatusCode code = slot.status().code();
    return finish([&]() REQUIRES(mu_) {
      if (code == StatusCode::kAlreadyExists) {
        if (Status cached = samples_.states().AlreadyCached(sample); !cached.ok()) {
          Check(cached);
          Check(samples_.states().NoRoom(sample));  // never left preparing: its assembler prepares it
        }
      } else {
        // No room (pinned samples fill the cache): its assembler prepares it instead.
        if (code != StatusCode::kResourceExhausted) log::Warn("{}", slot.status().ToString());
        Check(samples_.states().NoRoom(sample));
      }
    });
  }
  Result<PreparedShape> written = [&] {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kDecode);
    return PrepareInto(src.spec, *bytes, slot->data, src.raw_shape);
  }();
  if (!written.ok()) {
    (void)cache_->Abort(sample);
    progress.allocated = false;
    return finish([&]() REQUIRES(mu_) { MarkBad(sample, src, written.status()); });
  }
  Result<cache::SlotRef> committed = [&] {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kCommit);
    return cache_->Commit(sample);
  }();
  progress.allocated = false;
  finish([&]() REQUIRES(mu_) {
    if (!committed.ok()) {
      log::Error("sample {}: {}", src.record.id, committed.status().ToString());
      Check(samples_.states().Abandoned(sample));
      return;
    }
    ++preparations_;
    if (src.spec.gpu_decode && !written->encoded()) ++gpu_decode_cpu_fallbacks_;
    Check(samples_.states().Committed(sample, *written));
  });
}

Result<PreparedImage> Engine::PrepareTransient(const SampleSource& source) {
  FaultInjection::MaybeThrow(options_.faults.prepare, "preparation", source.record.id);
  Result<std::vector<uint8_t>> bytes = reader_.Read(source.record);
  if (!bytes.ok()) return bytes.status();
  return PrepareSample(source.spec, *bytes, source.raw_shape);
}

void Engine::AssembleInto(const BatchTask& task, AssembleResult& out) {
  Job& job = *task.job;
  out.owned.reserve(task.items.size());  // views point into it: no reallocation
  // The samples the cache could not give (no room, or evicted before the pin) are prepared first,
  // by this assembler and by workers idle now: a batch of them prepared here alone kept a
  // lagger's GPU job at a tenth of the rate while 15 of 16 workers idled (docs/server.md).
  std::vector<size_t> transient_items;
  for (size_t i = 0; i < task.items.size(); ++i) {
    if (!task.items[i].pinned) transient_items.push_back(i);
  }
  std::vector<std::optional<Result<PreparedImage>>> transient;  // by item; sized only when used
  if (!transient_items.empty()) {
    transient.resize(task.items.size());
    const WorkerPool::Load load = workers_->CurrentLoad();
    const size_t idle = workers_->size() - std::min(workers_->size(), load.busy + load.queued);
    workers_->ParallelFor(transient_items.size(), idle, [&](size_t k) {
      const size_t i = transient_items[k];
      WorkerPhases::Scope phase(phases_, WorkerPhase::kTransient);
      transient[i] = PrepareTransient(*task.items[i].source);
    });
  }
  for (size_t i = 0; i < task.items.size(); ++i) {
    const BatchItem& item = task.items[i];
    const uint32_t id = item.sample - job.key_base;
    FaultInjection::MaybeThrow(options_.faults.assemble, "assembly", id);
    PreparedView view;
    if (item.pinned) {
      Result<std::span<const uint8_t>> data = cache_->PinnedData(item.sample);
      if (!data.ok()) {  // cannot happen while pinned
        out.unreadable.emplace_back(item.sample, data.status());
        ++out.skipped;
        continue;
      }
      view = {data->data(), item.shape};
    } else {
      Result<PreparedImage>& image = *transient[i];
      if (!image.ok()) {
        out.unreadable.emplace_back(item.sample, image.status());
        ++out.skipped;
        continue;
      }
      ++out.transient;
      out.owned.push_back(std::move(*image));
      view = out.owned.back().view();
    }
    if (view.shape.encoded() && job.gpu == nullptr) {
      // A decode=gpu sample kept encoded, for a CPU job of a dataset registered with that spec:
      // the CPU decodes it to the same pixels.
      Result<PreparedImage> image = [&] {
        WorkerPhases::Scope phase(phases_, WorkerPhase::kTransient);
        return PrepareGpuPixelsOnCpu(job.prepare, {view.data, view.shape.encoded_bytes});
      }();
      if (!image.ok()) {
        out.unreadable.emplace_back(item.sample, image.status());
        ++out.skipped;
        continue;
      }
      out.owned.push_back(std::move(*image));
      view = out.owned.back().view();
    }
    Result<ImageShape> shape = TransformedShape(job.transform, view.shape);
    if (!shape.ok() || !(*shape == job.image)) {
      // The job cannot use the sample at all: a configuration error, so the job fails with it
      // (other jobs' transforms may fit the sample, so it is not marked bad).
      out.misfit = Status::InvalidArgument(fmt::format(
          "sample {} of dataset \"{}\" is prepared as {}x{}x{}, which the job's transform \"{}\" "
          "does not turn into its batch shape {}x{}x{}; add a crop to the dataset's prepare spec "
          "or to the transform",
          id, job.request.dataset, view.shape.height, view.shape.width, view.shape.channels,
          job.transform.ToString(), job.image.height, job.image.width, job.image.channels));
      return;
    }
    out.views.push_back(view);
    out.seeds.push_back(item.seed);
    out.labels.push_back(item.label);
    out.ids.push_back(item.sample);
  }
  // An injected sampling fault (tests only): the sample is delivered again in its neighbour's
  // place.
  if (!options_.faults.repeat.empty() && job.gpu == nullptr && out.ids.size() >= 2) {
    for (size_t k = 0; k < out.ids.size(); ++k) {
      if (options_.faults.repeat.count(out.ids[k] - job.key_base) == 0) continue;
      const size_t into = k + 1 < out.ids.size() ? k + 1 : k - 1;
      out.views[into] = out.views[k];
      out.labels[into] = out.labels[k];
      out.ids[into] = out.ids[k];
      break;  // once per batch
    }
  }

  // Every batch index of an epoch is published, even with no sample in it (all skipped, or the
  // assembly failed), so that the client sees each batch's skipped count and no index is missing.
  out.n = static_cast<uint32_t>(out.views.size());
  if (out.n == 0) return;
  // A GPU job's host slot holds labels and ids only; its images go to its device slot.
  slots::BatchLayout full = slots::PlanBatchLayout(out.n, job.gpu ? 0 : job.image.bytes());
  uint8_t* base = task.slot.data.data();
  Status assembled;
  if (job.gpu != nullptr) {
    for (uint32_t key : out.ids) {
      FaultInjection::MaybeThrow(options_.faults.gpu_build, "GPU batch build", key - job.key_base);
    }
    DeviceBatchRequest request;
    request.spec = &job.transform;
    request.samples = out.views;
    request.sample_ids = out.ids;  // keys: they key the resident area
    request.seeds = out.seeds;
    request.labels = out.labels;
    request.slots = job.device_slots.get();
    request.slot = task.slot.index;
    request.prepare = &job.prepare;
    request.job_decoder = job.decoder;
    if (job.decoder != nullptr && job.request.world_size <= 1 && job.request.nodes <= 1) {
      // The job decodes this build's JPEGs in its process: its next build may plan and send
      // its own now, so that the job's decoder never waits for this one's copies and assembly.
      request.job_work_sent = [this, &job, &out] {
        {
          WorkerLock lock(*this);
          if (out.released) return;
          out.released = true;
          job.assembling = false;
          woken_ = true;
        }
        wake_.notify_one();
      };
    }
    std::vector<std::pair<size_t, Status>> undecodable;
    request.undecodable = &undecodable;
    WorkerPhases::Scope phase(phases_, WorkerPhase::kGpuBuild);
    assembled = job.gpu->Build(request);
    if (!assembled.ok() && !undecodable.empty()) {
      // Damaged JPEGs that neither nvJPEG nor the CPU decodes: skipped and reported as the CPU
      // path does, and the batch built again from the rest (decoded and resident by now).
      std::vector<bool> bad(out.views.size(), false);
      for (auto& [index, why] : undecodable) {
        bad[index] = true;
        out.unreadable.emplace_back(out.ids[index], std::move(why));
        ++out.skipped;
      }
      size_t kept = 0;
      for (size_t i = 0; i < out.views.size(); ++i) {
        if (bad[i]) continue;
        out.views[kept] = out.views[i];
        out.seeds[kept] = out.seeds[i];
        out.labels[kept] = out.labels[i];
        out.ids[kept] = out.ids[i];
        ++kept;
      }
      out.views.resize(kept);
      out.seeds.resize(kept);
      out.labels.resize(kept);
      out.ids.resize(kept);
      out.n = static_cast<uint32_t>(kept);
      full = slots::PlanBatchLayout(out.n, 0);  // where Assemble will say the labels and ids are
      undecodable.clear();
      request.samples = out.views;
      request.sample_ids = out.ids;
      request.seeds = out.seeds;
      request.labels = out.labels;
      assembled = kept == 0 ? Status::OK() : job.gpu->Build(request);
    }
  } else {
    WorkerPhases::Scope phase(phases_, WorkerPhase::kAssemble);
    assembled = AssembleBatch(job.transform, out.views, out.seeds, base + full.images_offset,
                              full.images_bytes)
                    .status();
  }
  if (assembled.ok()) {
    std::memcpy(base + full.labels_offset, out.labels.data(), full.labels_bytes);
    for (uint32_t& id : out.ids) id -= job.key_base;  // keys to catalog ids
    std::memcpy(base + full.ids_offset, out.ids.data(), full.ids_bytes);
  } else {
    log::Error("job {}: batch {} of epoch {} not assembled, its {} samples are skipped: {}",
               job.id, task.batch_index, task.epoch, out.n, assembled.ToString());
    out.skipped += out.n;
    out.n = 0;
  }
}

void Engine::Assemble(BatchTask task) {
  Job& job = *task.job;
  AssembleResult out;
  out.skipped = task.skipped;
  // The fault barrier: a throw fails this job (or its data-parallel group) with the error; the
  // pins and the slot come back below as after any batch, and the other jobs go on.
  std::optional<Status> fault;
  try {
    AssembleInto(task, out);
    fault = out.misfit;
  } catch (const std::exception& e) {
    fault = Status::Internal(fmt::format("batch {} of epoch {} failed inside the server: {}",
                                         task.batch_index, task.epoch, e.what()));
  } catch (...) {
    fault = Status::Internal(fmt::format("batch {} of epoch {} failed inside the server: an "
                                         "exception of unknown type",
                                         task.batch_index, task.epoch));
  }
  const uint32_t n = fault ? 0 : out.n;
  uint32_t skipped = out.skipped;
  const slots::BatchLayout layout = slots::PlanBatchLayout(n, job.gpu ? 0 : job.image.bytes());
  uint64_t unpinned = 0;
  for (const BatchItem& item : task.items) {
    if (!item.pinned) continue;
    (void)cache_->Unpin(item.sample);
    ++unpinned;
  }
  bool abandon = false;
  if (task.overlaps || job.decoder != nullptr) {
    // A job's builds may overlap (GPU decode in its process): its batches still arrive in order,
    // and none after the job failed (a fault in its other build took it out of the scheduler;
    // with a build in flight, done means failed).
    WorkerLock lock(*this);
    if (task.overlaps) mu_.Wait(assembled_, [&] { return job.builds_delivered == task.order; });
    abandon = job.done && !fault;
  }
  std::optional<WorkerPhases::Scope> delivering(std::in_place, phases_, WorkerPhase::kDeliver);
  Result<uint64_t> generation =
      fault     ? Result<uint64_t>(*fault)
      : abandon ? Result<uint64_t>(Status::FailedPrecondition("its job failed while it was built"))
                : job.pool->Publish(task.slot.index);
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
    {
      // Counted before the job can see the batch: a job's stats read after its last batch
      // arrived include that batch (a client read them first and found 8 samples missing).
      WorkerLock lock(*this);
      job.deliveries += n;
      deliveries_ += n;
      ++job.batches;
      ++batches_;
    }
    job.sink->DeliverBatch(ready);
  } else {
    (void)job.pool->Abandon(task.slot.index);
    if (!fault && !abandon) {
      log::Error("job {}: batch {} of epoch {} not published, its {} samples are skipped: {}",
                 job.id, task.batch_index, task.epoch, n, generation.status().ToString());
      skipped += n;  // consumed, never delivered
    }
  }
  delivering.reset();

  {
    WorkerLock lock(*this);
    pins_ -= unpinned;
    for (const auto& [sample, status] : out.unreadable) {
      std::shared_ptr<const SampleSource> source = samples_.Source(sample);
      if (source) MarkBad(sample, *source, status);
    }
    transient_preparations_ += out.transient;
    if (fault) {
      FailJob(job, *fault);
    } else if (!abandon) {
      job.source->Consumed(task.decisions, Now());  // a rank's: once every slice is built
    }
    job.consumed += task.decisions;
    job.skipped += skipped;
    skipped_ += skipped;
    if (!out.released) job.assembling = false;
    --job.builds;  // only now, after the build's GPU work finished (the static_assert above)
    ++job.builds_delivered;
    fair_clock_ = std::max(fair_clock_, task.fair_tag);
    woken_ = true;
  }
  assembled_.notify_all();
  wake_.notify_one();
}

}  // namespace carpool
