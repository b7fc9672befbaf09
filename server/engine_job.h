// One job as the engine keeps it. Private to the engine's source files.
// Thread-compatible: every field is GUARDED_BY(Engine::mu_) except `pool` (thread-safe) and the
// fields fixed at creation.
#ifndef CARPOOL_SERVER_ENGINE_JOB_H_
#define CARPOOL_SERVER_ENGINE_JOB_H_

#include <cstdint>
#include <memory>
#include <string>

#include "protocol/protocol.h"
#include "server/batch_pool.h"
#include "server/engine.h"
#include "server/gpu_service.h"
#include "server/transform.h"

namespace carpool {

struct Engine::Job {
  // Fixed at creation.
  uint64_t id = 0;
  JobId sched = 0;  // the scheduler's and the sampling tree's id (same value)
  protocol::CreateJob request;
  uint64_t dataset_size = 0;
  TransformSpec transform;
  ImageShape image;  // of one transformed sample
  std::shared_ptr<JobSink> sink;
  std::unique_ptr<BatchPool> pool;  // labels and ids (and the images of a CPU job)
  GpuService* gpu = nullptr;       // the GPU that builds its batches, or null for the CPU
  std::unique_ptr<DeviceSlots> device_slots;  // images and int64 labels, slot i = pool slot i
  double created = 0;  // Engine::Now()

  // Progress.
  uint32_t epoch = 0;       // epoch of the latest batch built
  uint64_t next_batch = 0;  // batch index within that epoch
  uint64_t consumed = 0;    // queue entries done with: delivered, skipped or dropped
  uint64_t deliveries = 0;  // samples delivered
  uint64_t batches = 0;
  uint64_t skipped = 0;  // unreadable samples, or ones its transform cannot take, left out
  uint64_t dropped = 0;  // samples of last partial batches dropped (drop_last)
  bool assembling = false;  // a batch task is queued or running; at most one per job
  // The front batch's readiness scan (TryBuildBatch), resumed where the last one stopped: its
  // first `front_prepared` samples were prepared then, and after the first scan every sample of
  // it had its preparation started. Reset when the front batch changes.
  size_t front_prepared = 0;
  bool front_scanned = false;
  bool removed = false;     // RemoveJob has begun: build nothing more
  bool done = false;        // end-of-data sent and the job left the scheduler
  bool misfit_logged = false;  // a sample its transform cannot take was logged (once per job)
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_ENGINE_JOB_H_
