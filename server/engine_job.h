// One job as the engine keeps it. Private to the engine's source files and its batch sources.
// Thread-compatible: every field is GUARDED_BY(Engine::mu_) except `pool` (thread-safe) and the
// fields fixed at creation.
#ifndef CARPOOL_SERVER_ENGINE_JOB_H_
#define CARPOOL_SERVER_ENGINE_JOB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protocol/protocol.h"
#include "server/batch_pool.h"
#include "server/batch_source.h"
#include "server/gpu_service.h"
#include "server/job_service.h"
#include "server/scheduler.h"
#include "server/transform.h"

namespace carpool {

struct EngineJob {
  // Fixed at creation.
  uint64_t id = 0;  // the client's job id (a rank's own, not its group's participant)
  protocol::CreateJob request;
  uint64_t dataset_size = 0;
  std::string prepare_spec;  // its dataset's, as text
  PrepareSpec prepare;       // the same; decode=gpu when its GPU decodes its JPEGs
  uint32_t key_base = 0;  // its prepare spec's (PreparedKeys): sample key = key_base + catalog id
  Roaring table_ids;  // the keys it counts as a user of in the sample table (its dataset's)
  bool nothing_left = false;  // resumed from a checkpoint taken after its last batch
  TransformSpec transform;
  ImageShape image;  // of one transformed sample
  std::shared_ptr<JobSink> sink;
  // Its process decodes its builds' JPEGs (JobInfo::decode_in_job): sink's job_decoder().
  JobDecoder* decoder = nullptr;
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
  // Batch tasks queued or running: at most kMaxBuilds, and a second only while the first waits
  // for the job's own GPU decode (Engine::TryBuildBatch). They deliver in the order taken.
  uint32_t builds = 0;
  bool assembling = false;  // a batch task that has not let the next one start yet
  uint64_t builds_taken = 0, builds_delivered = 0;  // the order of delivery
  static constexpr uint32_t kMaxBuilds = 2;
  uint64_t fair_finish = 0;  // samples-fair queuing: where its latest batch's samples end
  // The front batch's readiness scan (TryBuildBatch), resumed where the last one stopped: its
  // first `front_prepared` samples were prepared then, and after the first scan every sample of
  // it had its preparation started. Reset when the front batch changes.
  size_t front_prepared = 0;
  bool front_scanned = false;
  bool removed = false;     // RemoveJob has begun: build nothing more
  bool done = false;        // end-of-data sent and the job left the scheduler

  // Its batches: the scheduler's queue of its own participant, or its slice of a data-parallel
  // group's (server/batch_source.h). Set when it joins the scheduler or its group.
  std::unique_ptr<BatchSource> source;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_ENGINE_JOB_H_
