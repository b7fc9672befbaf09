// The seam between the control plane (sockets, sessions, leases) and the engine (scheduler,
// preparation, batch assembly). The control plane validates every frame and the protocol limits,
// then calls a JobService; the engine answers through the JobSink it got for the job.
#ifndef CARPOOL_SERVER_JOB_SERVICE_H_
#define CARPOOL_SERVER_JOB_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "server/job_decode.h"
#include "carpool/status.h"
#include "protocol/protocol.h"

namespace carpool {

// Where the engine sends a job's batches. Implemented by the job's session.
// Thread-safe and non-blocking: each call encodes the frame on the calling thread and posts it to
// the io thread. Once the session has closed, calls are dropped silently.
class JobSink {
 public:
  virtual ~JobSink() = default;
  // A batch published in the job's BatchPool. The engine holds at most `prefetch` unreleased
  // batches (BatchPool guarantees it); a session receiving more drops the extra batch with an
  // error log and releases it back through JobService::Release.
  virtual void DeliverBatch(const protocol::BatchReady& batch) = 0;
  // The job has received all its epochs; no more batches follow.
  virtual void DeliverEndOfData(uint32_t epochs_completed) = 0;
  // A failure that ends the job (e.g. its dataset vanished). The client's Next() returns it; the
  // job stays until the client leaves, so RemoveJob still follows.
  virtual void DeliverError(const Status& status) = 0;
  // The job's process as a GPU decoder (job_decode.h), or null when the sink cannot be one.
  virtual JobDecoder* job_decoder() { return nullptr; }
};

// Implemented by the engine. Release is called on the control plane's io thread; CreateJob runs in
// its join lane (ControlPlane::RunJoin), RemoveJob and Stats in its control lane (RunControl), each
// a small thread pool, so calls may come at once from several threads. Release must not block
// (the io thread serves every session); none may wait on preparation ahead. The control plane has
// already checked: 1 <= batch_size <= max_batch_size, 1 <= prefetch <= max_prefetch, epochs >= 1, a
// non-empty dataset name, the job count limit, and that a Release names a batch it delivered to
// that job and that the client has not released yet.
class JobService {
 public:
  virtual ~JobService() = default;

  // Registers a job and returns its description, including a unique nonzero job id and the
  // BatchPool segment (slot_count == request.prefetch). Keep `sink` until RemoveJob(job_id).
  // Errors (unknown dataset, bad transform or device...) are sent to the client as-is, so their
  // messages must say what was wrong and what to do.
  virtual Result<protocol::JobInfo> CreateJob(const protocol::CreateJob& request,
                                              std::shared_ptr<JobSink> sink) = 0;

  // The client is done with a delivered batch: free its slot, which returns one credit.
  virtual Status Release(uint64_t job_id, uint32_t slot, uint64_t generation) = 0;

  // The job's session closed (bye, disconnect, lease expiry, protocol violation, server stop).
  // Drop the job from the tree, free its queue, references, pins and all its slots, and drop the
  // sink. Called exactly once per successfully created job. When it returns, no engine thread may
  // call the job's sink any more (the control plane may be destroyed right after).
  virtual void RemoveJob(uint64_t job_id) = 0;

  // Statistics as a JSON text: of one job, or server-wide when job_id == 0.
  virtual std::string Stats(uint64_t job_id) = 0;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_JOB_SERVICE_H_
