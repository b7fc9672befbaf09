// The carpool C++ client: attach a training job to the local carpool server and read its batches
// zero-copy from shared memory.
//
//   auto client = carpool::Client::Connect("/run/carpool/carpool.sock");
//   if (!client.ok()) die(client.status());
//   auto job = (*client)->CreateJob({.dataset = "imagenet", .batch_size = 256, .epochs = 2});
//   if (!job.ok()) die(job.status());
//   for (;;) {
//     auto batch = (*job)->Next();
//     if (!batch.ok()) die(batch.status());   // server gone, lease lost, bad data...
//     if (!batch->has_value()) break;          // all epochs delivered
//     Train((*batch)->images(), (*batch)->labels());
//   }                                          // each Batch releases its slot when destroyed
//
// Lifetime:
//  - A Client only remembers the server's address; each Job holds its own connection, its own
//    read-write mapping of its batch slots (they are its alone) and one background thread that
//    reads frames and sends heartbeats (every lease/4), so a long training step never loses the
//    lease.
//  - GPU jobs (device "cuda:N"): images and int64 labels are in the server's device memory on
//    GPU N, mapped into this process through CUDA IPC. Release a batch only after the GPU work
//    that reads it has finished (synchronize the stream that uses it, or wait on an event
//    recorded after that work): the server writes a later batch into the slot after release.
//  - A Batch's views stay valid until the Batch is destroyed or Release()d. Destroying the Batch
//    returns its slot and one credit to the server. A Batch may outlive its Job (its views stay
//    mapped; the release is then dropped, since the server already freed the job's slots).
//  - Destroying a Job says bye; the server removes the job and frees its slots at once.
// Failure:
//  - Every call that talks to the server fails within the job's silence_timeout (default 10 s)
//    with StatusCode::kUnavailable if the server is gone, restarted or hung; none hangs.
//  - After any error from Next() the job is finished; create a new one (Client may reconnect).
// Thread contract: Client is thread-safe. Job is thread-compatible (call Next/Stats from one
// thread at a time); Batch objects may be destroyed on any thread.
#ifndef CARPOOL_CLIENT_H_
#define CARPOOL_CLIENT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "carpool/types.h"

namespace carpool {

// A job's position, for a training checkpoint: the epoch in progress and what of it the job has
// taken (every batch Next() returned). A job created with JobOptions::resume set to it receives
// exactly the rest of that epoch, in a new uniform order, then its remaining epochs: nothing
// repeated, nothing lost, on the same server or a restarted one.
struct JobPosition {
  std::string dataset;
  uint32_t epochs = 0;          // of the job that took it
  uint32_t epoch = 0;           // the epoch in progress, 0-based; == epochs once all delivered
  uint64_t batches = 0;         // batches of that epoch taken
  uint64_t samples = 0;         // samples taken over the job's life, across resumes
  std::vector<uint32_t> taken;  // ids of that epoch's samples taken, ascending

  // Bytes for a checkpoint file (a few bytes per run of ids, at most ~1 bit per id of the
  // dataset's range); Parse reads them back, with kCorruption naming what is wrong. O(taken).
  std::string Serialize() const;
  static Result<JobPosition> Parse(std::string_view bytes);
};

struct JobOptions {
  std::string dataset;         // a dataset registered with 'carpool dataset add'
  uint32_t batch_size = 32;    // 1..server limit
  uint32_t epochs = 1;         // >= 1
  std::string transform;       // e.g. "random_crop(224)|flip|normalize(imagenet)|float16|nchw"
  std::string device = "cpu";  // "cpu" or "cuda:N"
  uint32_t prefetch = 4;       // batches the server may prepare ahead (credits), 1..server limit
  bool drop_last = false;      // drop the last, partial batch of each epoch
  uint64_t seed = 0;           // the job's own transform randomness
  // Data-parallel (DDP) jobs: world_size ranks that pass the same job_key form one job; its
  // global batch is world_size x batch_size and rank r gets slice r of each (DistributedSampler's
  // split). Every rank gets the same number of batches per epoch. world_size 1: a job of its own.
  std::string job_key{};
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // A job spanning `nodes` nodes, one server each: this node's server serves part `node` of the
  // dataset (hash partition, carpool server --partition-seed); world_size counts this node's ranks.
  uint32_t node = 0;
  uint32_t nodes = 1;
  // Silence from the server longer than this fails calls with kUnavailable. The server answers
  // every heartbeat, so silence means it is gone or hung.
  std::chrono::milliseconds silence_timeout{10000};
  // Start where a checkpoint left off (Job::Position() of an earlier job on this dataset).
  std::optional<JobPosition> resume{};
};

// A zero-copy view of a batch's images: shape is {samples, sample dims...} in `layout` order.
// For a GPU job (device >= 0) data is device memory of that CUDA device, owned by the server,
// writable by this job only and complete when Next() returns it.
struct TensorView {
  const void* data = nullptr;
  int device = -1;  // CUDA device index, or -1 for host memory
  std::vector<int64_t> shape;
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNHWC;
  size_t bytes = 0;
};

class Batch {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  ~Batch();  // releases the slot

  const TensorView& images() const;
  std::span<const int32_t> labels() const;
  std::span<const uint32_t> sample_ids() const;
  uint32_t epoch() const;        // 0-based
  uint64_t index() const;        // batch index within the epoch, 0-based
  uint32_t size() const;         // samples in this batch (< batch_size for a last partial batch)
  uint32_t skipped() const;      // samples of this batch's range skipped as unreadable
  // GPU jobs: the labels as int64 in device memory beside the images; null for a CPU job.
  int64_t* device_labels() const;
  // Returns the slot now; the views are invalid afterwards. Idempotent.
  void Release();

  struct Impl;

 private:
  friend class Job;
  explicit Batch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Job {
 public:
  ~Job();  // says bye and stops the background thread
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Blocks until the next batch, std::nullopt once all epochs are delivered, or an error
  // (kUnavailable when the server is gone or silent; the server's error otherwise).
  Result<std::optional<Batch>> Next();
  // This job's statistics as JSON text, from the server.
  Result<std::string> Stats();
  // Where the job stands: the batches Next() has returned (all of them, or all but the latest
  // with exclude_latest, for a binding that fetched one it has not handed out). O(taken log taken).
  JobPosition Position(bool exclude_latest = false) const;

  uint64_t id() const;
  uint64_t dataset_size() const;
  uint64_t batches_per_epoch() const;
  uint32_t epochs() const;
  uint32_t start_epoch() const;  // where the job started: 0, or a resumed checkpoint's epoch
  uint64_t start_batch() const;  // and batch within it
  std::vector<int64_t> sample_shape() const;
  DType dtype() const;
  Layout layout() const;
  int device() const;  // the CUDA device its batches are built on, or -1 for host memory

  struct State;

 private:
  friend class Client;
  explicit Job(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

class Client {
 public:
  // Checks that a carpool server answers at socket_path (kUnavailable if not).
  static Result<std::unique_ptr<Client>> Connect(const std::string& socket_path);
  // Creates a job on its own connection. Fails with the server's error for a bad request (unknown
  // dataset, batch size out of range...), kUnavailable if the server is gone.
  Result<std::unique_ptr<Job>> CreateJob(const JobOptions& options);
  // Server-wide statistics (jobs, cache, sharing) as JSON text.
  Result<std::string> Stats();

  const std::string& server_instance() const { return instance_; }
  std::chrono::milliseconds lease() const { return lease_; }

 private:
  Client(std::string path, std::string instance, std::chrono::milliseconds lease)
      : path_(std::move(path)), instance_(std::move(instance)), lease_(lease) {}
  std::string path_;
  std::string instance_;
  std::chrono::milliseconds lease_;
};

}  // namespace carpool

#endif  // CARPOOL_CLIENT_H_
