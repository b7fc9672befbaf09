// A job's CPU batch slots: one memfd (mode 0600, sealed against resizing, named nowhere in
// /dev/shm) holding slot_count slots of fixed capacity, laid out as protocol/batch_slot_layout.h
// says. Only the job's own process gets it: its session sends it with the job-info (ShareSegment).
// The slot count is the job's prefetch depth, so "a free slot exists" is exactly "the job has a
// credit": the engine can never have more than prefetch unreleased batches. Thread-safe: the engine
// acquires and publishes from its threads while the control plane releases from the io thread.
//
// Slot life: kFree --Acquire--> kWriting --Publish (generation+1)--> kPublished --Release--> kFree.
// kWriting --Abandon--> kFree (a batch that could not be built). ReleaseAll returns every slot,
// e.g. when the job's client died. The destructor unmaps and closes the segment; clients that
// still map it keep their view until they unmap.
#ifndef CARPOOL_SERVER_BATCH_POOL_H_
#define CARPOOL_SERVER_BATCH_POOL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "protocol/batch_slot_layout.h"
#include "protocol/protocol.h"
#include "protocol/segment_fd.h"

namespace carpool {

// A slot acquired for writing. `data` is the slot's whole data area (slot_bytes).
struct WritableSlot {
  uint32_t index = 0;
  std::span<uint8_t> data;
};

// The batch-ready message for a published slot whose batch of `samples` samples was placed as
// `layout` (slots::PlanBatchLayout) says. skipped is left 0 for the caller to fill in.
protocol::BatchReady MakeBatchReady(uint64_t job_id, uint32_t slot, uint64_t generation,
                                    uint32_t epoch, uint64_t batch_index, uint32_t samples,
                                    const slots::BatchLayout& layout);

// A memfd of `bytes` for a client to map: mode 0600, its pages reserved, then sealed so that no
// holder (the client has it read-write) can shrink it under the server's writes (a SIGBUS).
// `what` names it in errors ("job 3's batch slots"); `fix` says what to do when memory is short.
Result<UniqueFd> CreateSealedSegment(const std::string& name, uint64_t bytes, std::string_view what,
                                     std::string_view fix);

class BatchPool {
 public:
  // The memfd's name for a job, "carpool-<instance>-job-<id>" (/proc/<pid>/fd shows
  // "/memfd:<name> (deleted)"). instance must be [A-Za-z0-9_-]+.
  static std::string SegmentName(const std::string& instance, uint64_t job_id);

  // Unlinks every /dev/shm segment of `instance` that a server before protocol 5 (which named
  // its batch segments there) left when it died. Call at server start. Returns how many.
  static int RemoveStaleSegments(const std::string& instance);

  // Creates and maps the segment, named `name` (unique among this process's live pools), 0600
  // under --group too: the job's process gets it by fd. Fails with InvalidArgument on a bad
  // geometry or name, AlreadyExists for a name in use, ResourceExhausted when the memory
  // available cannot hold it, IOError when memfd_create fails.
  static Result<std::unique_ptr<BatchPool>> Create(const std::string& name, uint64_t job_id,
                                                   uint32_t slot_count, uint64_t slot_bytes);
  // A new descriptor of the live pool named `name`, for its session to send to the job's
  // process. NotFound when no pool of this process has that name (its job was removed).
  static Result<UniqueFd> ShareSegment(const std::string& name);
  // The pools alive in this process, of every instance: what a clean stop brings to 0.
  static size_t LiveCount();
  // The links in `proc_dir` (/proc/<pid>/fd, or /proc/<pid>/map_files as root) to batch segments
  // of `instance` ("/memfd:carpool-<instance>-job-<id> (deleted)"), as paths; none when it cannot
  // be read.
  static std::vector<std::string> SegmentLinks(const std::string& proc_dir,
                                               const std::string& instance);
  ~BatchPool();
  BatchPool(const BatchPool&) = delete;
  BatchPool& operator=(const BatchPool&) = delete;

  // A free slot, or nullopt when all slots are out (no credit). Never blocks.
  std::optional<WritableSlot> TryAcquire();
  // Waits up to `timeout` for a free slot; nullopt on timeout or after Shutdown().
  std::optional<WritableSlot> Acquire(std::chrono::milliseconds timeout);
  // kWriting -> kPublished; returns the slot's new generation for the batch-ready message.
  Result<uint64_t> Publish(uint32_t slot);
  // kWriting -> kFree without a new generation.
  Status Abandon(uint32_t slot);
  // kPublished -> kFree. Fails (InvalidArgument) unless the slot is published with `generation`.
  Status Release(uint32_t slot, uint64_t generation);
  // Every slot back to kFree (writing slots too: call only when the job's producer has stopped).
  void ReleaseAll();
  // Wakes blocked Acquire calls and makes later ones return nullopt at once.
  void Shutdown();

  const std::string& name() const { return name_; }
  uint64_t job_id() const { return job_id_; }
  uint32_t slot_count() const { return slot_count_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t FreeCount() const;
  uint32_t PublishedCount() const;

 private:
  BatchPool() = default;
  slots::SlotHeader& Header(uint32_t slot);
  WritableSlot TakeLocked(uint32_t slot) REQUIRES(mu_);

  std::string name_;
  uint64_t job_id_ = 0;
  uint32_t slot_count_ = 0;
  uint64_t slot_bytes_ = 0;
  slots::SegmentGeometry geometry_;
  UniqueFd fd_;  // the memfd, kept to share it
  std::unique_ptr<protocol::SharedMapping> region_;
  uint8_t* base_ = nullptr;

  mutable Mutex mu_;
  std::condition_variable freed_;
  std::vector<slots::SlotState> state_ GUARDED_BY(mu_);  // the shm copy is for readers only
  bool shutdown_ GUARDED_BY(mu_) = false;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_BATCH_POOL_H_
