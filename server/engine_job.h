// One job as the engine keeps it. Private to the engine's source files.
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
#include "server/engine.h"
#include "server/gpu_service.h"
#include "server/scheduler.h"
#include "server/transform.h"

namespace carpool {

struct Engine::Job {
  // Fixed at creation.
  uint64_t id = 0;
  JobId sched = 0;  // the scheduler's and the sampling tree's id (same value)
  protocol::CreateJob request;
  uint64_t dataset_size = 0;
  std::string prepare_spec;  // its dataset's, as text
  uint32_t key_base = 0;  // its prepare spec's (PreparedKeys): sample key = key_base + catalog id
  Roaring table_ids;  // the keys it counts as a user of in the sample table (its dataset's)
  bool nothing_left = false;  // resumed from a checkpoint taken after its last batch
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
  uint64_t fair_finish = 0;  // samples-fair queuing: where its latest batch's samples end
  // The front batch's readiness scan (TryBuildBatch), resumed where the last one stopped: its
  // first `front_prepared` samples were prepared then, and after the first scan every sample of
  // it had its preparation started. Reset when the front batch changes.
  size_t front_prepared = 0;
  bool front_scanned = false;
  bool removed = false;     // RemoveJob has begun: build nothing more
  bool done = false;        // end-of-data sent and the job left the scheduler

  // A rank of a data-parallel job: its group holds the scheduler's participant (`sched` is the
  // group's once it has formed, 0 before) and splits each global batch into the ranks' slices.
  Group* group = nullptr;
  uint32_t rank = 0;
};

// The ranks of one data-parallel job (CreateJob with world_size > 1), by job key. The group is
// one participant of the sampling tree; its front global batch, once taken from the scheduler,
// is padded (last batch of an epoch, no drop_last) to world_size equal slices; each rank builds
// its slice when it has a free slot, and the group consumes the batch once every slice is built.
struct Engine::Group {
  std::string key;
  protocol::CreateJob request;  // of the first rank to join: the fields every rank must share
  uint64_t dataset_size = 0;   // of this node's part
  std::vector<Job*> ranks;      // by rank; null until it joins, and after it leaves
  uint32_t joined = 0;
  double created = 0;           // Engine::Now() of the first join
  JobId sched = 0;              // the scheduler's participant once every rank joined
  bool failed = false;          // a rank left early or the ranks did not all join in time
  uint32_t finished = 0;        // ranks that received end-of-data

  // The front global batch.
  bool front_set = false;
  std::vector<Decision> front;  // world_size x slice entries, padding included
  size_t front_consumes = 0;    // queue entries it takes (its size before padding)
  uint32_t slice = 0;           // samples per rank
  std::vector<bool> taken;      // the rank has a slot for its slice
  uint32_t assembled = 0;       // slices whose assembly finished
  uint64_t padded = 0;          // entries repeated to give every rank an equal last batch
  // Every rank takes the same number of steps: each epoch has exactly this many global batches
  // (node_partition.h: AgreedBatchesPerEpoch), padded with repeats or cut short as needed.
  uint64_t batches_per_epoch = 0;
  uint32_t epoch = 0;           // of the latest global batch
  uint64_t epoch_batches = 0;   // global batches of `epoch` so far
  std::vector<Decision> last;   // the latest full-data global batch: the source of padding
  uint64_t dropped = 0;         // entries of last partial global batches dropped (drop_last)

  uint32_t world_size() const { return request.world_size; }
  uint64_t global_batch() const { return uint64_t{request.world_size} * request.batch_size; }
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_ENGINE_JOB_H_
